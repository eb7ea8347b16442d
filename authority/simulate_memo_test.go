package authority

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	coordinationv1 "k8s.io/api/coordination/v1"
	"slices"
	"sync"

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
	parseCA, parseBundle, parseCert, signedBy, verify, sign := costly.parseCA, costly.parseBundle, costly.parseCert, costly.signedBy, costly.verify, costly.sign
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
	signatures := newSimMemo[bool]()
	costly.signedBy = func(c, ca *x509.Certificate) bool {
		return signatures.get(func() bool { return signedBy(c, ca) }, c.Raw, ca.Raw)
	}
	verified := newSimMemo[error]()
	costly.verify = func(pub crypto.PublicKey, msg, sig []byte) error {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return verify(pub, msg, sig)
		}
		return verified.get(func() error { return verify(pub, msg, sig) }, der, msg, sig)
	}
	// A replica's own announcement verifies with its key: that is what a
	// signature is. Forged, replayed and garbled ones are made by other
	// paths (signAnnouncement called directly) and verified for real.
	costly.sign = func(l *coordinationv1.Lease, key crypto.Signer) error {
		if err := sign(l, key); err != nil {
			return err
		}
		der, err := x509.MarshalPKIXPublicKey(key.Public())
		sig, err2 := base64.StdEncoding.DecodeString(l.Annotations[SignatureAnnotation])
		if err == nil && err2 == nil {
			verified.put(nil, der, announcementMessage(l), sig)
		}
		return nil
	}
}

// simMemo maps a hash of its inputs to a result, safe for concurrent use.
// It forgets everything when it holds simMemoMax results: seeds share
// little, so a bound keeps a run of a million seeds flat in memory.
type simMemo[V any] struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte]V
}

const simMemoMax = 1 << 15

func newSimMemo[V any]() *simMemo[V] {
	return &simMemo[V]{m: map[[sha256.Size]byte]V{}}
}

func (m *simMemo[V]) get(compute func() V, parts ...[]byte) V {
	k := simMemoKey(parts)
	m.mu.Lock()
	v, ok := m.m[k]
	m.mu.Unlock()
	if ok {
		return v
	}
	v = compute()
	m.put(v, parts...)
	return v
}

func (m *simMemo[V]) put(v V, parts ...[]byte) {
	k := simMemoKey(parts)
	m.mu.Lock()
	if len(m.m) >= simMemoMax {
		clear(m.m)
	}
	m.m[k] = v
	m.mu.Unlock()
}

func simMemoKey(parts [][]byte) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}
