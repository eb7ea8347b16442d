package authority

import (
	"crypto/x509"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// alternative serves one of an issuer's further leaves: the leaf of one key
// type after the first, for the same names, signed by the same CA and
// replaced at the same moment as the primary leaf.
type alternative struct {
	i    *issuer
	n    int // index into i.alts
	name string
	// sniNames are the issuer's explicit SNI names: an alternative is
	// selected for the same names as the primary leaf.
	sniNames []string
}

var (
	_ dynamiccertificates.SNICertKeyContentProvider = &alternative{}
	_ dynamiccertificates.Notifier                  = &alternative{}
)

// newAlternatives makes one provider per key type after the first.
func newAlternatives(i *issuer, sniNames []string) []dynamiccertificates.SNICertKeyContentProvider {
	var out []dynamiccertificates.SNICertKeyContentProvider
	for n := 1; n < len(i.cfg.keyTypes); n++ {
		out = append(out, &alternative{i: i, n: n - 1, name: i.leafName(n), sniNames: sniNames})
	}
	return out
}

// leafName is the provider name leaf n (0 the primary) is served, logged
// and counted under: the issuer's name for the primary, "<name>/<key type>"
// for the others, e.g. "self-signed/rsa-2048".
func (i *issuer) leafName(n int) string {
	if n == 0 {
		return i.cfg.name
	}
	return i.cfg.name + "/" + string(i.cfg.keyTypes[n])
}

// Name returns "<issuer name>/<key type>".
func (a *alternative) Name() string { return a.name }

// CurrentCertKeyContent returns the leaf of this key type and its key, or
// nil, nil before the issuer made its first leaves. Callers must not modify
// the returned slices.
func (a *alternative) CurrentCertKeyContent() ([]byte, []byte) {
	a.i.mu.RLock()
	defer a.i.mu.RUnlock()
	if a.n >= len(a.i.alts) {
		return nil, nil
	}
	return a.i.alts[a.n].CertPEM, a.i.alts[a.n].KeyPEM
}

// SNINames returns the issuer's explicit SNI names, or nil.
func (a *alternative) SNINames() []string { return a.sniNames }

// AddListener adds l to the issuer's listeners: every leaf changes at once,
// so they share one notification.
func (a *alternative) AddListener(l dynamiccertificates.Listener) { a.i.AddListener(l) }

// Leaf returns the current leaf of this key type, or nil.
func (a *alternative) Leaf() *x509.Certificate {
	a.i.mu.RLock()
	defer a.i.mu.RUnlock()
	if a.n >= len(a.i.alts) {
		return nil
	}
	return a.i.alts[a.n].Cert
}

// RenewAt returns when the leaves are due to be replaced.
func (a *alternative) RenewAt() time.Time { return a.i.renewAt() }
