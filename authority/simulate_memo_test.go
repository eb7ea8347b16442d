package authority

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	coordinationv1 "k8s.io/api/coordination/v1"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/evercert/evercert/internal/pki"
)

// The simulator runs many replicas in one process: each parses the same
// Secret on every check and verifies the same Lease renewal as every other
// replica. The pure functions of the rotation (costly.go) are memoized by
// input for the whole test binary, so each distinct input is still parsed
// or verified for real, once, and the simulator spends its time on states
// instead of on repeated ECDSA. A memoized result is the result of a real
// call on the same bytes; nothing the rotation decides can differ.
func init() {
	parseCA, parseBundle, parseCert, parseLeaf, signedBy, verify, sign, issueLeaf := costly.parseCA, costly.parseBundle, costly.parseCert, costly.parseLeaf, costly.signedBy, costly.verify, costly.sign, costly.issueLeaf
	fingerprint := costly.fingerprint
	type issued struct {
		v   *pki.Issued
		err error
	}
	cas := newSimMemo[issued]()
	costly.parseCA = func(certPEM, keyPEM []byte) (*pki.Issued, error) {
		r := cas.get(func() issued { v, err := parseCA(certPEM, keyPEM); return issued{v, err} }, certPEM, keyPEM)
		if r.v == nil {
			return nil, r.err
		}
		c := *r.v // callers may set fields of theirs (caKeys.resolveKeys)
		return &c, r.err
	}
	type bundle struct {
		v   []*x509.Certificate
		err error
	}
	bundles := newSimMemo[bundle]()
	costly.parseBundle = func(pemBytes []byte) ([]*x509.Certificate, error) {
		r := bundles.get(func() bundle { v, err := parseBundle(pemBytes); return bundle{v, err} }, pemBytes)
		return slices.Clone(r.v), r.err
	}
	type cert struct {
		v   *x509.Certificate
		err error
	}
	certs := newSimMemo[cert]()
	costly.parseCert = func(der []byte) (*x509.Certificate, error) {
		r := certs.get(func() cert { v, err := parseCert(der); return cert{v, err} }, der)
		return r.v, r.err
	}
	leaves := newSimMemo[*x509.Certificate]()
	costly.parseLeaf = func(s string) *x509.Certificate {
		// The bytes of s, read only: a key is copied when stored.
		b := unsafe.Slice(unsafe.StringData(s), len(s))
		return leaves.get(func() *x509.Certificate { return parseLeaf(s) }, b)
	}
	// Fingerprints by the certificate's identity, as signedPairs: the CAs
	// come from the memos of parsed CAs and bundles, so every check asks
	// of the same pointers. The entry keeps the Raw it hashed, and is
	// used only while the certificate still holds that same slice.
	type fp struct {
		raw []byte
		fp  string
	}
	fps := newSimPtrMemo[*x509.Certificate, fp]()
	costly.fingerprint = func(c *x509.Certificate) string {
		if v, ok := fps.get(c); ok && len(v.raw) == len(c.Raw) && unsafe.SliceData(v.raw) == unsafe.SliceData(c.Raw) {
			return v.fp
		}
		v := fingerprint(c)
		fps.put(c, fp{c.Raw, v})
		return v
	}
	signatures := newSimMemo[bool]()
	// Before the memo of their bytes, the same two certificates by
	// identity: a peer's leaf comes from the memo of announced leaves and
	// the CAs from that of bundles, so they are the same pointers at every
	// renewal, and a certificate is never changed once parsed.
	signedPairs := newSimPtrMemo[[2]*x509.Certificate, bool]()
	// A leaf the simulated replicas issued was signed by its CA's key
	// (issuer, by the leaf's identity): checked against a CA with another
	// public key, its signature does not verify (that would be an ECDSA
	// forgery), which peers ask at every renewal of a leaf of the newer
	// CA against the older CAs of the bundle, listed first.
	issuer := newSimPtrMemo[*x509.Certificate, crypto.PublicKey]()
	costly.signedBy = func(c, ca *x509.Certificate) bool {
		k := [2]*x509.Certificate{c, ca}
		if v, ok := signedPairs.get(k); ok {
			return v
		}
		if pub, ok := issuer.get(c); ok {
			if pub, ok := pub.(interface{ Equal(crypto.PublicKey) bool }); ok && !pub.Equal(ca.PublicKey) {
				signedPairs.put(k, false)
				return false
			}
		}
		v := signatures.get(func() bool { return signedBy(c, ca) }, c.Raw, ca.Raw)
		signedPairs.put(k, v)
		return v
	}
	// A leaf its CA signs verifies with the CA's key:
	// x509.CreateCertificate checks that the key it signs with is the
	// parent's public key and verifies the signature it made over the
	// leaf's TBSCertificate before it returns. CheckSignatureFrom checks
	// that same signature with the parent's key (without SHA-1), after
	// checking that the parent may sign certificates (caMaySign): where
	// both hold, its answer is known to be true without verifying again.
	//
	// Its peers parse the leaf from its announcement, which is
	// leafCertPEM of it (issuer.adopt), the encoding pki.IssueLeaf gave it
	// in leaf.CertPEM: parseAnnouncedLeaf of those bytes is
	// x509.ParseCertificate of leaf.Cert.Raw, which is how pki.IssueLeaf
	// made leaf.Cert, so the memo of announced leaves learns it here
	// instead of parsing it again at the first peer. issuedFor maps the
	// leaf's public key (by identity: its signer's Public()) to it.
	issuedFor := newSimPtrMemo[crypto.PublicKey, *x509.Certificate]()
	costly.issueLeaf = func(ca *pki.Issued, r pki.Request) (*pki.Issued, error) {
		leaf, err := issueLeaf(ca, r)
		if err != nil {
			return leaf, err
		}
		if caMaySign(ca.Cert) && !sha1Signed(leaf.Cert.SignatureAlgorithm) {
			signatures.put(true, leaf.Cert.Raw, ca.Cert.Raw)
		}
		issuer.put(leaf.Cert, ca.Cert.PublicKey)
		leaves.put(leaf.Cert, leaf.CertPEM)
		if simKeyHasIdentity(leaf.Key.Public()) {
			issuedFor.put(leaf.Key.Public(), leaf.Cert)
		}
		return leaf, err
	}
	verified := newSimMemo[error]()
	ders := newSimKeyDER()
	// Before the memo of the key's encoding, the message and the
	// signature: the signature alone (short) finds what was verified with
	// it, which holds when the key is the same one (the same leaf, parsed
	// once) and the message the same bytes.
	bySig := &simSigMemo{m: map[string]simVerification{}}
	costly.verify = func(pub crypto.PublicKey, msg, sig []byte) error {
		if err, ok := bySig.get(pub, msg, sig); ok {
			return err
		}
		der, err := ders.get(pub)
		if err != nil {
			return verify(pub, msg, sig)
		}
		err = verified.get(func() error { return verify(pub, msg, sig) }, der, msg, sig)
		// A copy: the caller reuses msg's buffer (costly.verify).
		bySig.put(pub, bytes.Clone(msg), sig, err)
		return err
	}
	// A replica's own announcement verifies with its key: that is what a
	// signature is. Forged, replayed and garbled ones are made by other
	// paths (signAnnouncement called directly) and verified for real.
	costly.sign = func(l *coordinationv1.Lease, key crypto.Signer) error {
		if err := sign(l, key); err != nil {
			return err
		}
		sig, err := base64.StdEncoding.DecodeString(l.Annotations[SignatureAnnotation])
		if err != nil {
			return nil
		}
		msg := announcementMessage(l)
		// Its peers verify with the public key of the leaf they parse
		// from the announcement, which the memo of announced leaves
		// gives them as the certificate issued for key (issueLeaf): that
		// key, by identity, verifies sig over msg. Else (a leaf issued
		// before the memo forgot it) by the key's encoding.
		pub := key.Public()
		if simKeyHasIdentity(pub) {
			if leaf, ok := issuedFor.get(pub); ok {
				bySig.put(leaf.PublicKey, msg, sig, nil)
				return nil
			}
		}
		if der, err := ders.get(pub); err == nil {
			verified.put(nil, der, msg, sig)
		}
		return nil
	}
}

// caMaySign is the check x509.Certificate.CheckSignatureFrom makes of the
// parent before it verifies the signature (crypto/x509, Go 1.26).
func caMaySign(ca *x509.Certificate) bool {
	if ca.Version == 3 && !ca.BasicConstraintsValid || ca.BasicConstraintsValid && !ca.IsCA {
		return false
	}
	if ca.KeyUsage != 0 && ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		return false
	}
	return ca.PublicKeyAlgorithm != x509.UnknownPublicKeyAlgorithm
}

// sha1Signed: CheckSignatureFrom refuses SHA-1 signatures, which
// CreateCertificate's own check accepts.
func sha1Signed(a x509.SignatureAlgorithm) bool {
	return a == x509.SHA1WithRSA || a == x509.ECDSAWithSHA1 || a == x509.DSAWithSHA1
}

// simKeyDER caches the PKIX encoding of public keys by identity: the memo
// of announcement signatures is keyed by the signer's public key, and a
// replica's key and a parsed leaf's key (parseCert is memoized, so a leaf
// is one certificate) are the same pointer every time, while encoding one
// costs as much as a map of every result. Keys are immutable; the map
// holds them, so a pointer is never reused for another key while cached.
type simKeyDER struct {
	mu sync.Mutex
	m  map[crypto.PublicKey][]byte
}

func newSimKeyDER() *simKeyDER { return &simKeyDER{m: map[crypto.PublicKey][]byte{}} }

func (c *simKeyDER) get(pub crypto.PublicKey) ([]byte, error) {
	if !simKeyHasIdentity(pub) { // ed25519.PublicKey is a slice
		return x509.MarshalPKIXPublicKey(pub)
	}
	c.mu.Lock()
	der, ok := c.m[pub]
	c.mu.Unlock()
	if ok {
		return der, nil
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.m) >= simMemoMax {
		clear(c.m)
	}
	c.m[pub] = der
	c.mu.Unlock()
	return der, nil
}

// simPtrMemo is a bounded map safe for concurrent use, for the memos keyed
// by identity (see simKeyDER): it holds its keys, so a pointer is never
// reused for another value while it is cached.
type simPtrMemo[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]V
}

func newSimPtrMemo[K comparable, V any]() *simPtrMemo[K, V] {
	return &simPtrMemo[K, V]{m: map[K]V{}}
}

func (m *simPtrMemo[K, V]) get(k K) (V, bool) {
	m.mu.Lock()
	v, ok := m.m[k]
	m.mu.Unlock()
	return v, ok
}

func (m *simPtrMemo[K, V]) put(k K, v V) {
	m.mu.Lock()
	if len(m.m) >= simMemoMax {
		clear(m.m)
	}
	m.m[k] = v
	m.mu.Unlock()
}

// simSigMemo maps a signature to the key (by identity) and message it was
// verified with, and the answer.
type simSigMemo struct {
	mu sync.Mutex
	m  map[string]simVerification
}

type simVerification struct {
	pub crypto.PublicKey
	msg []byte
	err error
}

func (m *simSigMemo) get(pub crypto.PublicKey, msg, sig []byte) (error, bool) {
	if !simKeyHasIdentity(pub) {
		return nil, false
	}
	m.mu.Lock()
	v, ok := m.m[string(sig)]
	m.mu.Unlock()
	if !ok || v.pub != pub || !bytes.Equal(v.msg, msg) {
		return nil, false
	}
	return v.err, true
}

// put keeps msg: the caller passes a copy of its own.
func (m *simSigMemo) put(pub crypto.PublicKey, msg, sig []byte, err error) {
	if !simKeyHasIdentity(pub) {
		return
	}
	m.mu.Lock()
	if len(m.m) >= simMemoMax {
		clear(m.m)
	}
	m.m[string(sig)] = simVerification{pub, msg, err}
	m.mu.Unlock()
}

// simKeyHasIdentity: the key is a pointer, comparable and never changed.
func simKeyHasIdentity(pub crypto.PublicKey) bool {
	switch pub.(type) {
	case *ecdsa.PublicKey, *rsa.PublicKey:
		return true
	}
	return false
}

// simMemo maps its inputs to a result, safe for concurrent use. The key is
// the inputs themselves, each prefixed with its length, rather than a
// digest of them: a map compares its keys in full, so no two inputs can
// share a result, and hashing a key costs less than a SHA-256 of it. It
// forgets everything when its keys hold simMemoBytes or it holds
// simMemoMax results: seeds share little, so a bound keeps a run of a
// million seeds flat in memory. A result
// forgotten is computed again, for real, to the same value.
type simMemo[V any] struct {
	mu    sync.Mutex
	m     map[string]V
	bytes int
}

const (
	simMemoBytes = 8 << 20
	// simMemoMax bounds the entries of every memo: a seed needs a few
	// hundred at a time (its leaves, renewals and Secrets), and a result
	// can be large (a parsed certificate), so the bound is a few seeds'
	// worth per worker.
	simMemoMax = 1 << 12
)

func newSimMemo[V any]() *simMemo[V] {
	return &simMemo[V]{m: map[string]V{}}
}

func (m *simMemo[V]) get(compute func() V, parts ...[]byte) V {
	var buf [2048]byte
	k := simMemoKey(buf[:0], parts)
	m.mu.Lock()
	v, ok := m.m[string(k)]
	m.mu.Unlock()
	if ok {
		return v
	}
	v = compute()
	m.putKey(v, k)
	return v
}

func (m *simMemo[V]) put(v V, parts ...[]byte) {
	var buf [2048]byte
	m.putKey(v, simMemoKey(buf[:0], parts))
}

func (m *simMemo[V]) putKey(v V, k []byte) {
	m.mu.Lock()
	if _, ok := m.m[string(k)]; !ok {
		if m.bytes+len(k) > simMemoBytes || len(m.m) >= simMemoMax {
			clear(m.m)
			m.bytes = 0
		}
		m.bytes += len(k)
	}
	m.m[string(k)] = v
	m.mu.Unlock()
}

// simMemoKey appends the key of parts to b. Every call of one memo passes
// the same number of parts, so one part is its own key.
func simMemoKey(b []byte, parts [][]byte) []byte {
	if len(parts) == 1 {
		return parts[0]
	}
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

// TestSimMemosAnswerAsTheRealCalls holds the simulator's memos to their
// promise: every answer is the one the real call gives on the same input,
// including the answers known without a call (a leaf its CA just signed, an
// announcement a replica just signed) and those found by identity, asked
// again as a peer would.
func TestSimMemosAnswerAsTheRealCalls(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "memo-ca", Now: now, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA(pki.Request{CommonName: "memo-other", Now: now, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := costly.issueLeaf(ca, pki.Request{CommonName: "memo", DNSNames: []string{"memo"}, Now: now, Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// A peer's copy of the leaf: parsed from its announcement.
	peerLeaf := costly.parseLeaf(string(leafCertPEM(leaf.Cert)))
	if peerLeaf == nil || !peerLeaf.Equal(leaf.Cert) {
		t.Fatalf("the announced leaf parses to %v", peerLeaf)
	}
	if got := costly.parseLeaf("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"); got != nil || parseAnnouncedLeaf("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n") != nil {
		t.Fatalf("a garbled leaf parses to %v", got)
	}
	// A leaf as a parent: signed, but not allowed to sign certificates.
	for _, c := range []*x509.Certificate{leaf.Cert, peerLeaf} {
		for _, parent := range []*x509.Certificate{ca.Cert, other.Cert, leaf.Cert} {
			want := c.CheckSignatureFrom(parent) == nil
			for range 2 { // computed or known, then found again
				if got := costly.signedBy(c, parent); got != want {
					t.Errorf("signedBy(%s, %s) = %v, CheckSignatureFrom says %v", c.Subject.CommonName, parent.Subject.CommonName, got, want)
				}
			}
		}
	}

	// Fingerprints, found again by the certificate's identity, and not
	// once its Raw is another certificate's.
	for _, c := range []*x509.Certificate{ca.Cert, other.Cert, leaf.Cert, peerLeaf} {
		for range 2 {
			if got, want := Fingerprint(c), fingerprint(c); got != want {
				t.Errorf("Fingerprint(%s) = %s, the real call says %s", c.Subject.CommonName, got, want)
			}
		}
	}
	reused := &x509.Certificate{Raw: ca.Cert.Raw}
	_ = Fingerprint(reused)
	reused.Raw = other.Cert.Raw
	if got, want := Fingerprint(reused), fingerprint(other.Cert); got != want {
		t.Errorf("Fingerprint of a certificate whose Raw changed = %s, the real call says %s", got, want)
	}

	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "memo", Labels: map[string]string{LeaseLabel: "memo"},
		Annotations: map[string]string{LeafAnnotation: string(leafCertPEM(leaf.Cert)), LeafSerialAnnotation: serial(leaf.Cert)}},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: now}}}
	if err := costly.sign(l, leaf.Key); err != nil {
		t.Fatal(err)
	}
	sig, err := base64.StdEncoding.DecodeString(l.Annotations[SignatureAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	replayed := l.DeepCopy()
	replayed.Spec.RenewTime = &metav1.MicroTime{Time: now.Add(time.Minute)}
	for _, c := range []struct {
		name string
		pub  crypto.PublicKey
		msg  []byte
	}{
		{"own key", leaf.Key.Public(), announcementMessage(l)},
		{"peer's copy of the key", peerLeaf.PublicKey, announcementMessage(l)},
		{"another renewal", peerLeaf.PublicKey, announcementMessage(replayed)},
		{"another key", other.Cert.PublicKey, announcementMessage(l)},
	} {
		want := verifyAnnouncementSignature(c.pub, c.msg, sig)
		for range 2 {
			if got := costly.verify(c.pub, c.msg, sig); (got == nil) != (want == nil) {
				t.Errorf("%s: verify = %v, the real call says %v", c.name, got, want)
			}
		}
	}
}

// TestAnnouncementMessageEncoding pins the signed encoding (each field as
// its uvarint length and its bytes, in this order): replicas of different
// versions verify each other's announcements.
func TestAnnouncementMessageEncoding(t *testing.T) {
	renew := time.Date(2031, 1, 2, 3, 4, 5, 678901000, time.UTC)
	full := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lease", Labels: map[string]string{LeaseLabel: "label"},
		Annotations: map[string]string{TrustedCAsAnnotation: "a,b", BundleHashAnnotation: "hash", LeafSerialAnnotation: "1f",
			LeafAnnotation: strings.Repeat("p", 300), ClocksAheadAnnotation: "r2"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("holder"), LeaseDurationSeconds: ptr.To(int32(360)), RenewTime: &metav1.MicroTime{Time: renew}}}
	ref := func(fields ...string) []byte {
		var b []byte
		for _, f := range fields {
			b = binary.AppendUvarint(b, uint64(len(f)))
			b = append(b, f...)
		}
		return b
	}
	want := ref(announcementVersion, "ns", "lease", "label", "holder", "360", "2031-01-02T03:04:05.678901Z", "a,b", "hash", "1f", strings.Repeat("p", 300), "r2")
	if got := announcementMessage(full); !bytes.Equal(got, want) {
		t.Errorf("announcementMessage(full) = %q, want %q", got, want)
	}
	covering := full.DeepCopy()
	covering.Annotations[CoveredTargetsAnnotation] = "t1\nt2"
	want = ref(announcementVersion, "ns", "lease", "label", "holder", "360", "2031-01-02T03:04:05.678901Z", "a,b", "hash", "1f", strings.Repeat("p", 300), "r2", "t1\nt2")
	if got := announcementMessage(covering); !bytes.Equal(got, want) {
		t.Errorf("announcementMessage(covering) = %q, want %q", got, want)
	}
	bare := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lease"}}
	want = ref(announcementVersion, "ns", "lease", "", "", "", "", "", "", "", "", "")
	if got := announcementMessage(bare); !bytes.Equal(got, want) {
		t.Errorf("announcementMessage(bare) = %q, want %q", got, want)
	}
}
