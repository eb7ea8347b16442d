package authority

import (
	"crypto/x509"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// WrittenBundleAnnotation records, on every write of an Authority that
// adopts another rotator's Secret (Config.Adopt), the CA bundle it wrote to
// ca.crt, as PEM. While the other rotator's pods still run, they rewrite
// the data (cert-controller and cert-manager their own keys, knative all of
// them) and keep the annotations. A replica that starts then (a restart, a
// rolling update's next pod) learns from the record the CAs its peers still
// serve leaves of: it trusts each recorded CA that is still valid, not
// marked compromised, and that a peer's Lease announces a leaf of (every
// one without announcements). Without the record it adopted the rewrite
// alone and published a bundle without its holding peers' CA. Not written
// in the Authority's own layout, which no other rotator writes.
const WrittenBundleAnnotation = "evercert.io/written-ca-bundle"

// maxRecordedTrust bounds the CAs taken from WrittenBundleAnnotation, so
// that a record edited into thousands of certificates costs no more than
// ca.crt at its largest: the trim's memory of the other writer's CAs
// (maxTrimmedCAs). The first ones are kept, as the Authority wrote them.
const maxRecordedTrust = maxTrimmedCAs

// writeBundleRecord stores the bundle written to ca.crt in
// WrittenBundleAnnotation (in an adopted layout; see there).
func writeBundleRecord(s *corev1.Secret, layout SecretLayout) {
	if layout == LayoutEvercert {
		delete(s.Annotations, WrittenBundleAnnotation)
		return
	}
	s.Annotations[WrittenBundleAnnotation] = string(s.Data[dynamiccert.SecretCAKey])
}

// recordedBundle returns the CAs of WrittenBundleAnnotation when the data
// of secret, read as st, were rewritten since the Authority's last write:
// WrittenCAAnnotation names a CA other than the one that signs now, as
// after the old rotator's rewrite; nil otherwise (the Authority's own
// writes need no record). A record that does not parse is left out,
// logged once: what the replica trusts is then the Secret's data, as
// before the record existed.
func (s *secretStore) recordedBundle(secret *corev1.Secret, st *caSet) []*x509.Certificate {
	certs, err := recordedBundle(secret, st)
	if err != nil {
		s.recordLog.Error(klog.Background(), fmt.Errorf("CA secret %s, annotation %s: %w", s.src.Key, WrittenBundleAnnotation, err),
			"The record of the bundle the Authority wrote last is not used whole", "provider", s.cfg.Name)
		return certs
	}
	s.recordLog.Reset()
	return certs
}

// recordedBundle is secretStore.recordedBundle without the log: the CAs
// to take, and why not all of the record when err is set.
func recordedBundle(secret *corev1.Secret, st *caSet) ([]*x509.Certificate, error) {
	rec, written := secret.Annotations[WrittenBundleAnnotation], secret.Annotations[WrittenCAAnnotation]
	if rec == "" || st.signing == nil || written == "" || written == Fingerprint(st.signing.Cert) {
		return nil, nil
	}
	certs, err := pki.ParseCABundle([]byte(rec))
	if err == nil && len(certs) > maxRecordedTrust {
		err, certs = fmt.Errorf("%d certificates, more than the %d taken", len(certs), maxRecordedTrust), certs[:maxRecordedTrust]
	}
	return certs, err
}

// trustRecorded adds to st, the state read by a process that has none in
// force yet (in.last is nil, or only the Secret as read during a clock
// skew hold: caSet.skewHeld), the recorded CAs (caSet.recorded) that a peer
// may serve a leaf of: still valid, not marked compromised or dropped, and
// announced by a peer's Lease (in.peerServes), or the anchor
// (AnchorCAAnnotation: a replica cut off since the migration began renews
// from it, with no Lease once its Lease is collected), or the CA that write
// signed with (WrittenCAAnnotation: the peer that wrote or read it signs
// with it next, renewing from it in memory while it holds, before its Lease
// announces a leaf of it; the simulator, seed 129, S1), or every one when
// this process cannot see the Leases (no announcements, or blind: RBAC, a
// list that keeps failing). A replica with a state in force keeps its own
// memory of what it served (foreignWriter's trim). Each CA added that way
// but the anchor, which stays until it expires, gets a retirement, as the
// trim gives the CAs it keeps for a leaf served then
// (foreignWriter.retireIn): it leaves the bundle once every leaf of it can
// have expired, unless a peer still serves one (machine.retire). With
// the Leases in sight the old rotator's CAs that no peer serves stay out,
// and those kept do not pile up: each replica of a rolling update adopts
// the rewrite it reads first, and carrying the record forward whole, or
// for good, kept one of them per rewrite (the simulator's A2 and A3).
// Without them nothing says which recorded CA a peer still serves, so each
// stays until it expires, as every CA the Secret had before an episode
// does then (foreignWriter.kept): a rolling update during the overlap adds
// one CA per pod to ca.crt, up to maxRecordedTrust (attack43: 7 after six
// pods), the price of never dropping a holding peer's CA. A skew hold's
// state counts as none: it keeps the Secret as read, so the record taken
// at the first step was gone from the second, and the first write after
// the hold put ca.crt out without the CA the peers serve (the simulator,
// seed 656, S1: a process started during a pause waited for its peers'
// renewals).
func (m *machine) trustRecorded(st *caSet, in stepInput) {
	if in.last != nil && !in.last.skewHeld || len(st.recorded) == 0 {
		return
	}
	seen := in.peerServes != nil && (in.obs.blind == nil || in.obs.blind() == "")
	for _, c := range st.recorded {
		fp := Fingerprint(c)
		if !c.IsCA || !in.now.Before(c.NotAfter) || st.ops.marks(fp) || containsCert(st.bundle, c) {
			continue
		}
		anchor := m.writer.anchored(c)
		if seen && !in.peerServes(c) && !anchor && fp != in.written {
			continue
		}
		st.bundle = append(st.bundle, c)
		if _, ok := st.retire[fp]; !ok && seen && m.writer != nil && !anchor {
			st.retireAt(c, in.now.Add(m.writer.retireIn))
		}
	}
}
