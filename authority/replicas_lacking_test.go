package authority

import (
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// TestLackingFollowsTheObserversNotTheBundle: a promotion forced by the
// signing CA's end is unsafe when a live peer's observers have not
// confirmed the successor (its consumers lack it), also when the peer
// loaded the same bundle as this replica; it is not when the peer's
// observers confirmed it and only its delay runs (DelayedCAPrefix, as
// machine.announced writes it). Before, a peer with the same bundle was
// taken to hold the successor whatever its observers said, so a forced
// promotion under a replica whose observer lagged was counted safe.
func TestLackingFollowsTheObserversNotTheBundle(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ca, err := pki.NewCA(pki.Request{CommonName: "successor", Now: now, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fp := Fingerprint(ca.Cert)
	for _, c := range []struct {
		name    string
		trusted []string
		lacking bool
	}{
		{"its observers have not confirmed it", []string{"0000"}, true},
		{"its observers confirmed it; its delay runs", []string{"0000", DelayedCAPrefix + fp}, false},
		{"it trusts it", []string{"0000", fp}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newReplicaSet(fake.NewClientset(), "ns", "ca", "r0", "test", time.Minute, 30*time.Second, clocktesting.NewFakeClock(now))
			r.listed = true
			r.want.bundleHash = "same-bundle"
			r.seen["peer"] = &seenLease{holder: "r1", trusted: c.trusted, observedAt: now, duration: time.Minute, bundleHash: "same-bundle"}
			if got := r.lacking(ca.Cert); got != c.lacking {
				t.Errorf("lacking = %v, want %v (peer announces %v and loaded the same bundle)", got, c.lacking, c.trusted)
			}
		})
	}
}
