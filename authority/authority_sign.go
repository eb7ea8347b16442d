package authority

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/evercert/evercert/internal/pki"
)

// LeafRequest asks an Authority to sign a leaf certificate for a key that
// is held elsewhere, e.g. a pod's key from a PodCertificateRequest.
type LeafRequest struct {
	// PublicKey is the key the leaf is issued to. Required.
	PublicKey crypto.PublicKey
	// CommonName is the leaf's subject common name; optional.
	CommonName string
	// DNSNames are the leaf's subject alternative names.
	DNSNames []string
	// Lifetime is the NotAfter-NotBefore asked for. Required. The leaf
	// gets it unless the signing CA expires sooner: NotAfter is then capped
	// at the CA's NotAfter (see MinLifetime).
	Lifetime time.Duration
	// MinLifetime is the shortest NotAfter-NotBefore the caller accepts
	// after that cap; a CA that ends sooner makes SignLeaf return a
	// *CAEndsTooSoonError. Default 0: any positive lifetime.
	MinLifetime time.Duration
	// Backdate puts NotBefore this long before now (never before the CA's
	// NotBefore), for clients whose clocks are behind. Default 0; it must
	// not be negative.
	Backdate time.Duration
}

// SignedLeaf is a leaf certificate SignLeaf made.
type SignedLeaf struct {
	// Cert is the leaf.
	Cert *x509.Certificate
	// CertPEM is the leaf alone, PEM encoded: its CA is a root that clients
	// trust through the Authority's bundle (CurrentCABundleContent), not an
	// intermediate a server must send.
	CertPEM []byte
	// CA is the CA that signed the leaf.
	CA *x509.Certificate
	// Capped reports that NotAfter was cut short to the CA's NotAfter.
	Capped bool
}

// ErrNoSigningCA is wrapped by SignLeaf while this replica has no CA that
// may sign: the CA Secret has not been read yet, the signing CA is not
// valid yet on this replica's clock, or it is marked compromised
// (CompromisedCAAnnotation) and its successor does not sign yet. The Authority notifies its listeners
// (AddListener) when that changes.
var ErrNoSigningCA = errors.New("no signing CA yet")

// CAEndsTooSoonError is SignLeaf's error when the signing CA expires before
// the request's MinLifetime would end. It passes as soon as the successor
// CA, already published, has been observed and signs; the Authority then
// notifies its listeners (AddListener).
type CAEndsTooSoonError struct {
	// CA is the signing CA's common name, NotAfter its expiry.
	CA       string
	NotAfter time.Time
	// Left is the longest lifetime the CA still allows, MinLifetime the
	// shortest the request accepts.
	Left, MinLifetime time.Duration
}

func (e *CAEndsTooSoonError) Error() string {
	return fmt.Sprintf("signing CA %q expires at %s, which leaves a leaf %v, less than the %v asked for; waiting for its successor to be observed",
		e.CA, e.NotAfter.UTC().Format(time.RFC3339), max(e.Left, 0), e.MinLifetime)
}

// SignLeaf signs a leaf for req.PublicKey with the CA that signs this
// replica's own leaf: the observed signing CA (see the package
// documentation), never a successor that is only published. The leaf is a
// server and client certificate, valid from now-Backdate (not before the
// CA's NotBefore) for Lifetime, with NotAfter capped at the CA's NotAfter;
// both at whole seconds. It makes no API call and is safe for concurrent
// use.
//
// Errors wrapping ErrNoSigningCA, and *CAEndsTooSoonError, mean "not now":
// try again when the Authority notifies its listeners (the signing CA
// changed). Other errors are about the request.
func (a *Authority) SignLeaf(req LeafRequest) (*SignedLeaf, error) {
	switch {
	case req.PublicKey == nil:
		return nil, errors.New("signing a leaf: no public key")
	case req.Lifetime <= 0:
		return nil, fmt.Errorf("signing a leaf: lifetime %v must be positive", req.Lifetime)
	case req.Backdate < 0 || req.MinLifetime < 0:
		return nil, fmt.Errorf("signing a leaf: backdate %v and minimum lifetime %v must not be negative", req.Backdate, req.MinLifetime)
	}
	a.mu.RLock()
	ca, ok, ops := a.cas.signing, a.hasState, a.cas.ops
	a.mu.RUnlock()
	if !ok || ca == nil {
		return nil, fmt.Errorf("%s: %w: the CA secret has not been read", a.cfg.Name, ErrNoSigningCA)
	}
	if a.emerg.compromised(ops, ca.Cert) {
		// The mark is read with the Secret: from then on nothing more is
		// signed with the CA, also before its successor is confirmed.
		return nil, fmt.Errorf("%s: %w: CA %q is marked compromised (%s on the CA secret); its successor signs once every observer confirms it",
			a.cfg.Name, ErrNoSigningCA, ca.Cert.Subject.CommonName, CompromisedCAAnnotation)
	}
	if ca.Key == nil {
		return nil, fmt.Errorf("%s: %w: CA %q was adopted without its key; its successor signs once observed", a.cfg.Name, ErrNoSigningCA, ca.Cert.Subject.CommonName)
	}
	now := a.cfg.Clock.Now().Truncate(time.Second)
	if now.Before(ca.Cert.NotBefore) {
		// Made by a replica whose clock is ahead (accepted within the skew
		// tolerance): a leaf signed now would not be valid here either.
		return nil, fmt.Errorf("%s: %w: CA %q is valid only from %s", a.cfg.Name, ErrNoSigningCA,
			ca.Cert.Subject.CommonName, ca.Cert.NotBefore.UTC().Format(time.RFC3339))
	}
	notBefore := now.Add(-req.Backdate)
	if notBefore.Before(ca.Cert.NotBefore) {
		notBefore = ca.Cert.NotBefore
	}
	notAfter := notBefore.Add(req.Lifetime)
	capped := notAfter.After(ca.Cert.NotAfter)
	if capped {
		notAfter = ca.Cert.NotAfter
	}
	if left := notAfter.Sub(notBefore); left <= 0 || left < req.MinLifetime || !now.Before(notAfter) {
		return nil, &CAEndsTooSoonError{CA: ca.Cert.Subject.CommonName, NotAfter: ca.Cert.NotAfter, Left: left, MinLifetime: req.MinLifetime}
	}
	cert, certPEM, err := pki.SignPublicKey(ca, req.PublicKey, req.CommonName, req.DNSNames, notBefore, notAfter)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", a.cfg.Name, err)
	}
	return &SignedLeaf{Cert: cert, CertPEM: certPEM, CA: ca.Cert, Capped: capped}, nil
}
