package authority

import (
	"crypto/x509"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/evercert/evercert/internal/pki"
)

// RetireAfterAnnotation records, in the CA Secret, when CAs leave ca.crt
// before they expire: "<fingerprint>=<RFC 3339 time>" entries separated by
// commas. After the rotator adopted from (Config.Adopt) stops rewriting the
// Secret, the Authority keeps the old rotator's CAs that a leaf served
// then chains to, and writes one entry for each: a leaf lifetime and a
// check interval later no leaf signed with it can still be valid (the old
// rotator's CAs are valid for years: ten at cert-controller's defaults).
// A CA past its time leaves ca.crt once no live replica serves a leaf of
// it. The time is in the Secret so that every replica drops the CA
// together, as at its expiry. Removing the annotation keeps the CAs until
// they expire.
const RetireAfterAnnotation = "evercert.io/retire-after"

// maxRetirements bounds the entries read from RetireAfterAnnotation: a
// trim records at most maxForeignCAs, and entries leave with their CA.
// An entry past the bound is ignored, which keeps its CA until it expires.
const maxRetirements = 2 * maxForeignCAs

// retirements maps a CA's Fingerprint to when it leaves the bundle.
type retirements map[string]time.Time

// parseRetirements reads RetireAfterAnnotation. A garbled entry is
// ignored: its CA then stays until it expires, which takes no trust away.
func parseRetirements(s *corev1.Secret) retirements {
	v := s.Annotations[RetireAfterAnnotation]
	if v == "" {
		return nil
	}
	r := retirements{}
	for e := range strings.SplitSeq(v, ",") {
		fp, at, ok := strings.Cut(strings.TrimSpace(e), "=")
		t, err := time.Parse(time.RFC3339, at)
		if !ok || err != nil || fp == "" {
			continue
		}
		if len(r) == maxRetirements {
			break
		}
		r[fp] = t
	}
	return r
}

// write stores the entries of the CAs still in bundle in s, in the
// bundle's order; a Secret without any has no annotation.
func (r retirements) write(s *corev1.Secret, bundle []*x509.Certificate) {
	var es []string
	for _, c := range bundle {
		fp := Fingerprint(c)
		if t, ok := r[fp]; ok {
			es = append(es, fp+"="+t.UTC().Format(time.RFC3339))
		}
	}
	if len(es) == 0 {
		delete(s.Annotations, RetireAfterAnnotation)
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[RetireAfterAnnotation] = strings.Join(es, ",")
}

// trustEnds is when c leaves the bundle of st: its NotAfter, or its
// recorded retirement when that comes first.
func (st *caSet) trustEnds(c *x509.Certificate) time.Time {
	end := c.NotAfter
	if st == nil {
		return end
	}
	if t, ok := st.retire[Fingerprint(c)]; ok && t.Before(end) {
		end = t
	}
	return end
}

// retireAt records that c leaves st's bundle at t (unless it signs or is
// the successor then, or a served leaf chains to it: machine.retire).
func (st *caSet) retireAt(c *x509.Certificate, t time.Time) {
	st.retire = maps.Clone(st.retire) // st's map may be shared with a clone
	if st.retire == nil {
		st.retire = retirements{}
	}
	st.retire[Fingerprint(c)] = t
}

// retire removes from st's bundle every CA whose recorded retirement has
// passed on this clock, unless it signs or is the successor (an old
// rotator's CA adopted again), or served reports a leaf of it served:
// this replica's, or one a peer's Lease announces, live or expired but
// not yet collected (replicaSet.announces: a peer cut off from the API
// server renews from the CA in its memory; an unlisted peer counts as
// serving every CA). It reports whether the bundle changed. A CA kept that
// way leaves at a later check, once nothing serves a leaf of it.
func (m *machine) retire(st *caSet, now time.Time, served func(*x509.Certificate) bool) bool {
	if len(st.retire) == 0 {
		return false
	}
	for _, ca := range []*pki.Issued{st.signing, st.next} {
		if ca != nil {
			if _, ok := st.retire[Fingerprint(ca.Cert)]; ok {
				st.retire = maps.Clone(st.retire)
				delete(st.retire, Fingerprint(ca.Cert))
			}
		}
	}
	// An anchor this process knows (foreignWriter.anchored) is never
	// retired either, whatever a peer that does not know it recorded: a
	// hand edit of AnchorCAAnnotation left a pod started since without it,
	// and that pod's retirement then took the anchor out of every
	// replica's bundle (review 45).
	for fp := range st.retire {
		if c := st.bundleCert(fp); c != nil && m.writer.anchored(c) {
			st.retire = maps.Clone(st.retire)
			delete(st.retire, fp)
		}
	}
	n := len(st.bundle)
	st.bundle = slices.DeleteFunc(slices.Clone(st.bundle), func(c *x509.Certificate) bool {
		t, ok := st.retire[Fingerprint(c)]
		return ok && !now.Before(t) && !st.knowsSigning(c) && !served(c)
	})
	return len(st.bundle) != n
}

// bundleCert returns the CA of st's bundle whose Fingerprint is fp, or nil.
func (st *caSet) bundleCert(fp string) *x509.Certificate {
	for _, c := range st.bundle {
		if Fingerprint(c) == fp {
			return c
		}
	}
	return nil
}

// knowsSigning reports whether c is st's signing CA or its successor.
func (st *caSet) knowsSigning(c *x509.Certificate) bool {
	return st.signing != nil && st.signing.Cert.Equal(c) || st.next != nil && st.next.Cert.Equal(c)
}
