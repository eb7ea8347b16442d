//go:build soak

package soak

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clienttesting "k8s.io/client-go/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
)

// Signed announcements (issue 21 §3): an attacker allowed to write Leases
// in the namespace, but holding no leaf of the Authority, rewrites the
// replicas' Leases and adds Leases of its own while a successor waits. A
// rewrite may neither speed a promotion up (forged-announcements) nor stall
// one forever (replayed-announcements, garbled-announcements); each is
// counted in evercert_replica_announcements_rejected_total, and no clock
// skew is reported on its word. Every step checks the usual invariant (no
// failed handshake for a client holding a bundle any replica published).

func forgedAnnouncementsScenario() scenario {
	return scenario{name: "forged-announcements", cycle: forgedAnnouncementsCycle, final: rejectionsFinal(certmetrics.AnnouncementForged),
		soakOnly: announcementsCoveredBy}
}

func replayedAnnouncementsScenario() scenario {
	return scenario{name: "replayed-announcements", cycle: replayedAnnouncementsCycle, final: rejectionsFinal(certmetrics.AnnouncementReplayed),
		soakOnly: announcementsCoveredBy}
}

func garbledAnnouncementsScenario() scenario {
	return scenario{name: "garbled-announcements", cycle: garbledAnnouncementsCycle,
		final: rejectionsFinal(certmetrics.AnnouncementGarbled, certmetrics.AnnouncementForged), soakOnly: announcementsCoveredBy}
}

// announcementsCoveredBy is what covers the announcement scenarios in make
// test: the simulator forges, replays and garbles Leases among its faults,
// and authority's TestAnnouncementForgedTrustDoesNotPromote and
// TestVerifyAnnouncement check the rules themselves.
const announcementsCoveredBy = "the simulator's forged, replayed and garbled Leases (test-sim) and authority's announcement tests"

// attackEvery is how often the attacker writes: several times within each
// renewal interval (lease/3) and within the minimum delay.
const attackEvery = 2 * time.Hour

// madeUpReplicas is how many Leases of replicas that do not exist the
// attacker adds: more than the real replicas, so that believed, their word
// would be a majority (clock skew) and would count as observers.
const madeUpReplicas = 5

// forgedAnnouncementsCycle blinds replica 2 (403 on Secrets for it alone)
// from before the successor's publication until half a day after its
// minimum delay ended, so that it never loads the successor and never announces
// it. Meanwhile, every two hours, the attacker (a) edits replica 2's Lease to
// list the successor as trusted, renewed now, without re-signing it, and
// (b) writes Leases of made-up replicas signed with a leaf of its own CA,
// trusting the successor and saying every real replica's clock is ahead.
// The successor must not sign while replica 2 lacks it, no replica may
// report clock skew, and the forgeries are counted as forged.
func forgedAnnouncementsCycle(w *world, _ int) {
	w.runTo(w.publishAt().Add(-time.Hour))
	blind := w.pods[2]
	blind.client.fault.Store(&apiFault{name: "403", resources: []string{"secrets"}, err: func(a clienttesting.Action) error {
		return apierrors.NewForbidden(a.GetResource().GroupResource(), secretName, errors.New("soak: this replica lost access to the CA Secret"))
	}})
	successor := w.toPublished()
	fp := authority.Fingerprint(successor)
	att := newAttacker(w)
	before := w.rejections(certmetrics.AnnouncementForged)
	end := w.now().Add(w.p.pd + 12*time.Hour)
	for w.now().Before(end) && !w.t.Failed() {
		w.act(func() {
			att.rewrite(blind.id, func(l *coordinationv1.Lease) {
				l.Annotations[authority.TrustedCAsAnnotation] = addCSV(l.Annotations[authority.TrustedCAsAnnotation], fp)
				l.Spec.RenewTime = &metav1.MicroTime{Time: w.now()}
			})
			att.madeUp(func(l *coordinationv1.Lease, _ int) {
				l.Annotations[authority.TrustedCAsAnnotation] = fp
				l.Annotations[authority.ClocksAheadAnnotation] = w.realIDs()
				att.sign(l)
			})
		})
		w.advance(attackEvery)
		st, _ := w.caState()
		require.False(w.t, st.signing.Equal(successor), "%s at %s: the successor signed on forged announcements while %s, which cannot read it, never announced it",
			w.name, w.simTime(), blind.name)
		w.assertNoSkew()
	}
	w.assertRejected(certmetrics.AnnouncementForged, before)
	w.act(att.removeMadeUp)
	blind.client.fault.Store(nil)
	w.advance(time.Minute) // the backoffs end
	w.toPromoted()
}

// replayedAnnouncementsCycle saves replicas 1 and 2's Leases two hours
// before the successor's publication. Replica 2 stops for good right after
// the publication, before it could announce the successor; from then on,
// every two hours, the attacker writes both saved Leases back (validly signed,
// older renewTime). Replica 2's last believed announcement must age out
// (the successor then signs without it: before signed announcements, each
// write-back looked like a renewal that does not trust the successor, and
// the successor waited forever), replica 1 must still count as it
// announces, and the write-backs are counted as replayed.
func replayedAnnouncementsCycle(w *world, _ int) {
	w.runTo(w.publishAt().Add(-2 * time.Hour))
	att := newAttacker(w)
	victim, live := w.pods[2], w.pods[1]
	saved := map[string]*coordinationv1.Lease{}
	for _, p := range []*pod{victim, live} {
		l := att.lease(p.id)
		require.NotNil(w.t, l, "%s's Lease", p.name)
		require.NotEmpty(w.t, l.Annotations[authority.SignatureAnnotation], "%s's Lease is signed", p.name)
		saved[p.id] = l
	}
	w.toPublished()
	w.act(victim.kill) // its Lease stays, as a killed pod's does
	before := w.rejections(certmetrics.AnnouncementReplayed)
	w.untilPromotedUnder(func() {
		for id, l := range saved {
			old := l.DeepCopy()
			att.rewrite(id, func(cur *coordinationv1.Lease) { cur.Annotations, cur.Spec = old.Annotations, old.Spec })
		}
	})
	w.assertRejected(certmetrics.AnnouncementReplayed, before)
	w.act(func() { w.startPod(victim.idx) })
	w.runFor(w.p.step)
}

// garbledAnnouncementsCycle stops replica 2 for good right after the
// successor's publication; from then on, every two hours, the attacker rewrites
// its Lease renewed now with, in turn, a signature that is not base64, a
// leaf that is no certificate, and a signature over other bytes (another
// replica's), and writes made-up replicas' Leases garbled the same ways
// (trusting nothing new, saying every real replica's clock is ahead).
// Replica 2 must age out as in replayed-announcements, no replica may
// report clock skew, and the rewrites are counted (garbled, or forged for
// a signature over other bytes).
func garbledAnnouncementsCycle(w *world, _ int) {
	w.runTo(w.publishAt().Add(-time.Hour))
	att := newAttacker(w)
	victim, other := w.pods[2], w.pods[1]
	w.toPublished()
	w.act(victim.kill) // its Lease stays, as a killed pod's does
	beforeG, beforeF := w.rejections(certmetrics.AnnouncementGarbled), w.rejections(certmetrics.AnnouncementForged)
	n := 0
	w.untilPromotedUnder(func() {
		otherSig := att.lease(other.id).Annotations[authority.SignatureAnnotation]
		garble := func(l *coordinationv1.Lease, k int) {
			l.Spec.RenewTime = &metav1.MicroTime{Time: w.now()}
			switch k % 3 {
			case 0:
				l.Annotations[authority.SignatureAnnotation] = "not base64!"
			case 1:
				l.Annotations[authority.LeafAnnotation] = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
			case 2:
				l.Annotations[authority.SignatureAnnotation] = otherSig
			}
		}
		att.rewrite(victim.id, func(l *coordinationv1.Lease) { garble(l, n) })
		att.madeUp(func(l *coordinationv1.Lease, i int) {
			l.Annotations[authority.ClocksAheadAnnotation] = w.realIDs()
			att.sign(l)
			if i%3 == 2 {
				// Over other bytes: the made-up Lease signed, then renewed.
				l.Spec.RenewTime = &metav1.MicroTime{Time: w.now().Add(time.Second)}
				return
			}
			garble(l, i)
		})
		n++
	})
	w.assertRejected(certmetrics.AnnouncementGarbled, beforeG)
	w.assertRejected(certmetrics.AnnouncementForged, beforeF)
	w.act(att.removeMadeUp)
	w.act(func() { w.startPod(victim.idx) })
	w.runFor(w.p.step)
}

// untilPromotedUnder steps attackEvery at a time, attacking before each step,
// until the successor published now signs: at most the minimum delay plus
// a lease duration (a stopped replica's last announcement ages out) plus a
// day. No replica may report clock skew meanwhile.
func (w *world) untilPromotedUnder(attack func()) {
	w.t.Helper()
	st, _ := w.caState()
	require.NotNil(w.t, st.next, "a successor waits")
	successor, published := st.next, w.now()
	limit := w.p.pd + w.p.lease + day
	for {
		if st, _ := w.caState(); st.signing.Equal(successor) {
			break
		}
		if w.t.Failed() {
			return
		}
		if w.now().Sub(published) > limit {
			w.t.Fatalf("%s at %s: the successor %s published at %s never signed under the attack (waited %v); pending %v",
				w.name, w.simTime(), serialOf(successor), published.Format(time.RFC3339), limit, pendingOf(w))
		}
		w.act(attack)
		w.advance(attackEvery)
		w.assertNoSkew()
	}
	w.t.Logf("%s at %s: the successor signed %s after its publication, under the attack", w.name, w.simTime(), formatDuration(w.now().Sub(published)))
}

func pendingOf(w *world) []string {
	var out []string
	for _, p := range w.live() {
		st, _ := authorityStatus(p.auth)
		out = append(out, fmt.Sprintf("%s: %v", p.name, st.pending))
	}
	return out
}

// assertNoSkew: no live replica holds its writes on clock evidence.
func (w *world) assertNoSkew() {
	w.t.Helper()
	for _, p := range w.live() {
		st, _ := authorityStatus(p.auth)
		require.Empty(w.t, st.clockSkew, "%s at %s: %s reports clock skew on the attacker's word", w.name, w.simTime(), p.name)
	}
}

// rejections sums evercert_replica_announcements_rejected_total{reason}
// over every Authority replica of the scenario.
func (w *world) rejections(reason string) float64 {
	var n float64
	for _, p := range w.all {
		n += certmetricstest.Value(w.t, "evercert_replica_announcements_rejected_total", map[string]string{"provider": p.provider("authority"), "reason": reason})
	}
	return n
}

// assertRejected checks that every live replica counted rejections for
// reason, more in all than before.
func (w *world) assertRejected(reason string, before float64) {
	w.t.Helper()
	for _, p := range w.live() {
		assert.Positive(w.t, certmetricstest.Value(w.t, "evercert_replica_announcements_rejected_total",
			map[string]string{"provider": p.provider("authority"), "reason": reason}), "%s counts %s announcements", p.name, reason)
	}
	assert.Greater(w.t, w.rejections(reason), before, "%s announcements counted in this cycle", reason)
}

// rejectionsFinal logs the rejections of the scenario by reason and checks
// that those of reasons were counted.
func rejectionsFinal(reasons ...string) func(w *world, _ int) {
	return func(w *world, _ int) {
		var parts []string
		for _, r := range []string{certmetrics.AnnouncementForged, certmetrics.AnnouncementReplayed, certmetrics.AnnouncementGarbled, certmetrics.AnnouncementUnsigned} {
			parts = append(parts, fmt.Sprintf("%s=%.0f", r, w.rejections(r)))
		}
		w.t.Logf("%s: announcements rejected by reason: %s", w.name, strings.Join(parts, " "))
		for _, r := range reasons {
			assert.Positive(w.t, w.rejections(r), "%s announcements counted", r)
		}
	}
}

// realIDs lists the live replicas' IDs, comma separated, as
// authority.ClocksAheadAnnotation does.
func (w *world) realIDs() string {
	var ids []string
	for _, p := range w.live() {
		ids = append(ids, p.id)
	}
	return strings.Join(ids, ",")
}

func addCSV(list, v string) string {
	if list == "" {
		return v
	}
	return list + "," + v
}

// attacker writes Leases straight into the API server's store, as anyone
// allowed to update Leases in the namespace can; it holds a CA and a leaf
// of its own, never one of the Authority's.
type attacker struct {
	w     *world
	leaf  *pki.Issued
	label string   // the Authority label of the real Leases
	fakes []string // names of the made-up Leases written
}

func newAttacker(w *world) *attacker {
	w.t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: "attacker", Now: w.now(), Lifetime: w.p.ca})
	require.NoError(w.t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: authorityHost, DNSNames: []string{authorityHost}, Now: w.now(), Lifetime: w.p.ca})
	require.NoError(w.t, err)
	a := &attacker{w: w, leaf: leaf}
	real := a.lease(w.pods[0].id)
	require.NotNil(w.t, real, "%s's Lease", w.pods[0].name)
	a.label = real.Labels[authority.LeaseLabel]
	a.checkEncoding(real)
	return a
}

// leases are the Authority's Leases as the API server holds them.
func (a *attacker) leases() []*coordinationv1.Lease {
	obj, err := a.w.api.tracker.List(leasesGVR, coordinationv1.SchemeGroupVersion.WithKind("Lease"), namespace)
	require.NoError(a.w.t, err)
	var out []*coordinationv1.Lease
	for _, l := range obj.(*coordinationv1.LeaseList).Items {
		if _, ok := l.Labels[authority.LeaseLabel]; ok {
			out = append(out, l.DeepCopy())
		}
	}
	return out
}

// lease is the Lease whose holder is the replica id, or nil.
func (a *attacker) lease(id string) *coordinationv1.Lease {
	for _, l := range a.leases() {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == id {
			return l
		}
	}
	return nil
}

// rewrite updates (or creates again) replica id's Lease with what forge
// makes of its current version.
func (a *attacker) rewrite(id string, forge func(*coordinationv1.Lease)) {
	t := a.w.t
	l := a.lease(id)
	require.NotNil(t, l, "the Lease of replica %s", id)
	forge(l)
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	require.NoError(t, a.w.api.tracker.Update(leasesGVR, l, namespace, metav1.UpdateOptions{}))
}

// madeUp writes the Leases of madeUpReplicas replicas that do not exist,
// renewed now, with what fill makes of each (i is its index).
func (a *attacker) madeUp(fill func(l *coordinationv1.Lease, i int)) {
	t := a.w.t
	for i := range madeUpReplicas {
		name := fmt.Sprintf("%s-made-up-%d", a.label, i)
		holder := fmt.Sprintf("made-up-%d", i)
		duration := int32(a.w.p.lease / time.Second)
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{authority.LeaseLabel: a.label},
				Annotations: map[string]string{
					authority.LeafAnnotation:       string(pki.EncodeCertPEM(a.leaf.Cert.Raw)),
					authority.LeafSerialAnnotation: a.leaf.Cert.SerialNumber.Text(16),
				}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &metav1.MicroTime{Time: a.w.now()}},
		}
		fill(l, i)
		if cur, err := a.w.api.tracker.Get(leasesGVR, namespace, name); err == nil {
			l.ResourceVersion = cur.(*coordinationv1.Lease).ResourceVersion
			require.NoError(t, a.w.api.tracker.Update(leasesGVR, l, namespace, metav1.UpdateOptions{}))
			continue
		}
		require.NoError(t, a.w.api.tracker.Create(leasesGVR, l, namespace, metav1.CreateOptions{}))
		a.fakes = append(a.fakes, name)
	}
}

// removeMadeUp deletes the made-up Leases.
func (a *attacker) removeMadeUp() {
	for _, name := range a.fakes {
		require.NoError(a.w.t, a.w.api.tracker.Delete(leasesGVR, namespace, name))
	}
	a.fakes = nil
}

// sign signs l with the attacker's own leaf, as a replica signs its
// announcement (authority.SignatureAnnotation): the signature
// verifies, but the leaf chains to no CA of the Secret.
func (a *attacker) sign(l *coordinationv1.Lease) {
	d := sha256.Sum256(announcementMessage(l))
	sig, err := a.leaf.Key.Sign(rand.Reader, d[:], crypto.SHA256)
	require.NoError(a.w.t, err)
	l.Annotations[authority.SignatureAnnotation] = base64.StdEncoding.EncodeToString(sig)
}

// checkEncoding verifies a real replica's signature with announcementMessage,
// so that the attacker's own signatures are well made (and rejected for
// their leaf, not for a mistake of this test).
func (a *attacker) checkEncoding(real *coordinationv1.Lease) {
	t := a.w.t
	require.IsType(t, &ecdsa.PrivateKey{}, a.leaf.Key, "the attacker's key")
	certs, err := pki.ParseCABundle([]byte(real.Annotations[authority.LeafAnnotation]))
	require.NoError(t, err)
	require.NotEmpty(t, certs)
	pub, ok := certs[0].PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve.Params().BitSize != 256 {
		t.Logf("%s: the replicas' leaf key is %T: the attacker's encoding is not checked against it", a.w.name, certs[0].PublicKey)
		return
	}
	sig, err := base64.StdEncoding.DecodeString(real.Annotations[authority.SignatureAnnotation])
	require.NoError(t, err)
	d := sha256.Sum256(announcementMessage(real))
	require.True(t, ecdsa.VerifyASN1(pub, d[:], sig), "the attacker's encoding of an announcement verifies a real replica's signature")
}

// announcementMessage is the encoding a replica signs, as
// authority.SignatureAnnotation documents it (announce_sign.go):
// each field as its length (uvarint) and its bytes.
func announcementMessage(l *coordinationv1.Lease) []byte {
	var b []byte
	field := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	field("evercert.io/replica-announcement/v1")
	field(l.Namespace)
	field(l.Name)
	field(l.Labels[authority.LeaseLabel])
	var holder, duration, renew string
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseDurationSeconds != nil {
		duration = strconv.Itoa(int(*l.Spec.LeaseDurationSeconds))
	}
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.UTC().Format(metav1.RFC3339Micro)
	}
	field(holder)
	field(duration)
	field(renew)
	for _, k := range []string{authority.TrustedCAsAnnotation, authority.BundleHashAnnotation, authority.LeafSerialAnnotation,
		authority.LeafAnnotation, authority.ClocksAheadAnnotation} {
		field(l.Annotations[k])
	}
	// The covered targets only when set, as the Authority encodes them.
	if c := l.Annotations[authority.CoveredTargetsAnnotation]; c != "" {
		field(c)
	}
	return b
}
