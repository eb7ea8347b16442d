package authority

import (
	"crypto/x509"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// WrittenBundleAnnotation records, on every write of an Authority that adopts
// another rotator's Secret (Config.Adopt), the CAs it wrote to ca.crt, as
// PEM. The old rotator's rewrites replace the data (cert-controller and
// cert-manager their own keys, knative all of them) but keep the
// annotations, so a replica that starts while another replica holds on
// those rewrites (foreignWriter) still learns the CAs its peers serve
// leaves of: a Lease names them by fingerprint only. Without the record
// such a replica adopted the rewrite alone and wrote and published a
// bundle without the CA of its holding peers' leaves (the simulator's S1,
// TestForeignWriterRestartedPeerKeepsHoldingPeersCA). Not written in the
// Authority's own layout (no old rotator writes there).
const WrittenBundleAnnotation = "evercert.io/written-ca-bundle"

// maxRecordedTrust bounds the CAs taken from WrittenBundleAnnotation: the
// record is the Authority's own ca.crt, a few CAs; one larger than that was
// not written by it, and trusting a pile of it is worse than what the
// record prevents.
const maxRecordedTrust = 16

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
// were rewritten since the Authority's last write of st's Secret s:
// WrittenCAAnnotation names a CA other than the one that signs now, as
// after the old rotator's rewrite; nil otherwise (the Authority's own
// writes need no record). A record that does not parse is left out and
// logged: what the replica trusts is then the Secret's data, as before the
// record existed.
func recordedBundle(s *corev1.Secret, st *caSet, name string) []*x509.Certificate {
	rec, written := s.Annotations[WrittenBundleAnnotation], s.Annotations[WrittenCAAnnotation]
	if rec == "" || st.signing == nil || written == "" || written == Fingerprint(st.signing.Cert) {
		return nil
	}
	certs, err := pki.ParseCABundle([]byte(rec))
	if err != nil || len(certs) > maxRecordedTrust {
		klog.Background().Info("Ignoring the CA secret's record of the CAs the Authority wrote last", "provider", name, "annotation", WrittenBundleAnnotation, "certificates", len(certs), "err", err)
		return nil
	}
	return certs
}

// trustRecorded adds to st, the state read by a process that has none in
// force yet (in.last is nil, or only the Secret as read during a clock
// skew hold: caSet.skewHeld), the recorded CAs (caSet.recorded) that a peer
// may serve a leaf of: still valid, not marked compromised or dropped, and
// announced by a peer's Lease (in.peerServes; every one without
// announcements). A replica with a state in force keeps its own memory of
// what it served (foreignWriter's trim). The old rotator's CAs that no
// peer serves stay out: each replica of a rolling update adopts the
// rewrite it reads first, and carrying the whole record forward kept one
// of them per rewrite (the simulator's A2). A skew hold's state counts as
// none: it keeps the Secret as read, so the record taken at the first
// step was gone from the second, and the first write after the hold put
// ca.crt out without the CA the peers serve (the simulator, seed 656, S1:
// a process started during a pause waited for its peers' renewals).
func trustRecorded(st *caSet, in stepInput) {
	if in.last != nil && !in.last.skewHeld {
		return
	}
	for _, c := range st.recorded {
		fp := Fingerprint(c)
		if !c.IsCA || !in.now.Before(c.NotAfter) || fp == st.ops.compromised || slices.Contains(st.ops.dropped, fp) || containsCert(st.bundle, c) {
			continue
		}
		if in.peerServes != nil && !in.peerServes(c) {
			continue
		}
		st.bundle = append(st.bundle, c)
	}
}
