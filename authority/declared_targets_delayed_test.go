package authority

import (
	"crypto/x509"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// TestForcedPromotionCountsADelayedPublisherAsCovering: the
// signing CA has ended, so its successor signs (a forced promotion). This
// process's own delay is over and its observers hold the successor. The
// only caBundle publisher runs in peer r0, whose observers confirmed the
// successor in the declared target while r0's own delay still runs: it
// announces "~<fingerprint>" with the target covered. Commit 13ae4ae says
// that such a peer's consumers hold the successor (replicaSet.lacking
// skips it), yet replicaSet.covering counts only plain fingerprints, so
// the declared target counts as uncovered and the promotion is recorded
// unsafe: the false unsafe count the old same-bundle skip was added for
// (soak pause-0.9-ca-after-publication) comes back whenever the publisher
// runs on one replica only (issue 27 §4) and another replica promotes.
// The control: the same peer announcing the plain fingerprint.
func TestForcedPromotionCountsADelayedPublisherAsCovering(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	old, err := pki.NewCA(pki.Request{CommonName: "old", Now: now.Add(-61 * time.Minute), Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	succ, err := pki.NewCA(pki.Request{CommonName: "successor", Now: now.Add(-30 * time.Minute), Lifetime: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const target = `ValidatingWebhookConfiguration "wh"`
	for _, c := range []struct {
		name      string
		announced string
		unsafe    bool
	}{
		{"the publisher's replica lists it plainly", Fingerprint(succ.Cert), false},
		{"the publisher's replica lists it as delayed", DelayedCAPrefix + Fingerprint(succ.Cert), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newReplicaSet(fake.NewClientset(), "ns", "ca", "r1", "test", time.Minute, 30*time.Second, clocktesting.NewFakeClock(now))
			r.listed = true
			r.seen["ca-r0"] = &seenLease{holder: "r0", trusted: []string{Fingerprint(old.Cert), c.announced}, observedAt: now, duration: time.Minute, covered: []string{target}}
			state := func() *caSet {
				return &caSet{signing: old, next: succ, bundle: []*x509.Certificate{old.Cert, succ.Cert},
					nextSince: now.Add(-30 * time.Minute), seenSince: now.Add(-30 * time.Minute),
					targets: []declaredTarget{{target: target, renewed: now}}}
			}
			m := machine{sched: rotation{name: "test", caLifetime: 2 * time.Hour, caRenewBefore: 40 * time.Minute, propagation: 10 * time.Minute, leafRenewBefore: 10 * time.Minute, skew: time.Minute}}
			res, err := m.step(stepInput{now: now, read: state(), exists: true, last: state(), obs: observation{
				// r0's announcement does not hold it plainly (its delay
				// runs): not every replica confirmed it.
				all:     func(ca *x509.Certificate) bool { return len(r.pending(ca)) == 0 },
				local:   func(*x509.Certificate) bool { return true },
				lacking: r.lacking,
				covered: r.covering,
			}})
			if err != nil {
				t.Fatal(err)
			}
			if res.state.signing == nil || !res.state.signing.Cert.Equal(succ.Cert) {
				t.Fatalf("the successor does not sign after the signing CA's end: %+v", res.state)
			}
			if res.unsafe != c.unsafe {
				t.Errorf("forced promotion counted unsafe = %v, want %v: %s (r0 announces %q covering %s; replicaSet.lacking = %v, covering = %v)",
					res.unsafe, c.unsafe, res.unsafeWhy, c.announced, target, r.lacking(succ.Cert), r.covering(succ.Cert))
			}
		})
	}
}
