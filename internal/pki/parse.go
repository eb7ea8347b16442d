package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// MaxPEMSize is the largest certificate, key or CA bundle accepted, 1 MiB.
// Real bundles are a few hundred KiB at most; anything larger is a mistake
// (or an attack) and is refused before it is parsed.
const MaxPEMSize = 1 << 20

// Sentinel errors, so callers and tests can tell failures apart with
// errors.Is. Every error returned by this package wraps one of them or a
// crypto error with context.
var (
	ErrEmpty          = errors.New("empty")
	ErrTooLarge       = fmt.Errorf("larger than %d bytes", MaxPEMSize)
	ErrMalformedPEM   = errors.New("malformed PEM")
	ErrEncryptedKey   = errors.New("encrypted private keys are not supported")
	ErrKeyMismatch    = errors.New("private key does not match certificate")
	ErrExpired        = errors.New("certificate has expired")
	ErrNotYetValid    = errors.New("certificate is not yet valid")
	ErrNotServingCert = errors.New("certificate is not valid for server authentication")
	// ErrBrokenChain: the certificates after the leaf are not its issuer
	// chain in order (each one the issuer of the one before it). Clients
	// that build the path from the served order, and any client missing
	// an intermediate, would fail to verify it.
	ErrBrokenChain = errors.New("certificate chain is out of order or broken")
)

// KeyPair is a parsed, validated serving certificate chain and its key.
type KeyPair struct {
	// TLS is ready for tls.Config.Certificates or GetCertificate; TLS.Leaf
	// is set.
	TLS tls.Certificate
	// Leaf is TLS.Leaf, for convenience.
	Leaf *x509.Certificate
}

// ParseCertKey parses and validates a PEM certificate chain and private key.
// It rejects empty or oversized input, trailing non-PEM data, encrypted or
// mismatched keys, leaves whose extended key usage excludes server auth,
// chains that are not in order (see ErrBrokenChain) and, when now is not
// zero, leaves that are not valid at now.
//
// The whole chain is kept in TLS.Certificate and served: the leaf first,
// then the intermediates as given, so a client that trusts only the root
// can verify it. Only the leaf's validity is checked: an expired
// intermediate or cross-signed root at the end of a chain is legitimate
// (clients that trust the root below it never use it).
func ParseCertKey(certPEM, keyPEM []byte, now time.Time) (*KeyPair, error) {
	if err := checkBlocks(certPEM, "certificate", isCertBlock); err != nil {
		return nil, err
	}
	if err := checkBlocks(keyPEM, "private key", isKeyBlock); err != nil {
		return nil, err
	}
	tlsCert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		if isMismatch(err) {
			return nil, fmt.Errorf("%w: %v", ErrKeyMismatch, err)
		}
		return nil, fmt.Errorf("%w: %v", ErrMalformedPEM, err)
	}
	leaf := tlsCert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(tlsCert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parsing certificate: %w", err)
		}
		tlsCert.Leaf = leaf
	}
	if err := CheckValidity(leaf, now); err != nil {
		return nil, err
	}
	if err := checkChain(leaf, tlsCert.Certificate[1:]); err != nil {
		return nil, err
	}
	if len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) &&
		!slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny) {
		return nil, fmt.Errorf("%w (subject %q)", ErrNotServingCert, leaf.Subject.CommonName)
	}
	return &KeyPair{TLS: tlsCert, Leaf: leaf}, nil
}

// checkChain checks that each certificate of chain issued the one before it,
// starting from leaf: the issuer name matches the subject, and the
// signature verifies with a key allowed to sign certificates. The errors
// name the certificates by position (1 is the leaf) and subject.
func checkChain(leaf *x509.Certificate, chain [][]byte) error {
	child := leaf
	for i, der := range chain {
		parent, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("%w: chain certificate %d: %v", ErrMalformedPEM, i+2, err)
		}
		if !bytes.Equal(child.RawIssuer, parent.RawSubject) {
			return fmt.Errorf("%w: certificate %d (subject %q) was issued by %q, but certificate %d is %q; "+
				"the chain must be the leaf, then each certificate's issuer in turn",
				ErrBrokenChain, i+1, child.Subject.CommonName, child.Issuer.CommonName, i+2, parent.Subject.CommonName)
		}
		if err := child.CheckSignatureFrom(parent); err != nil {
			return fmt.Errorf("%w: certificate %d (subject %q) is not signed by certificate %d (subject %q): %v",
				ErrBrokenChain, i+1, child.Subject.CommonName, i+2, parent.Subject.CommonName, err)
		}
		child = parent
	}
	return nil
}

// SplitCertKey splits one PEM file that holds a private key and its
// certificate chain into the chain and the key, as ParseCertKey takes them.
// The key may come first, as in the kubelet's podCertificate credential
// bundle (a PKCS#8 PRIVATE KEY block, then the chain), or after the chain
// (cat tls.crt tls.key). PKCS#8, PKCS#1 (RSA PRIVATE KEY) and SEC 1 (EC
// PRIVATE KEY, with or without EC PARAMETERS) keys are accepted. It requires
// exactly one private key and at least one certificate, and applies the
// structural rules of ParseCertKey (size, no trailing data, no encrypted
// key). The certificates keep their order; the returned PEM is re-encoded
// from the blocks, so text around them is dropped.
func SplitCertKey(data []byte) (certPEM, keyPEM []byte, err error) {
	const what = "certificate and key"
	err = checkBlocks(data, what, func(b *pem.Block) error {
		if isCertBlock(b) == nil {
			return nil
		}
		if err := isKeyBlock(b); err != nil {
			if errors.Is(err, ErrEncryptedKey) {
				return err
			}
			return fmt.Errorf("unexpected PEM block %q, want CERTIFICATE or a private key", b.Type)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	var certs, keys bytes.Buffer
	nKeys := 0
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			_ = pem.Encode(&certs, block) // writing to a bytes.Buffer cannot fail
			continue
		}
		if strings.HasSuffix(block.Type, "PRIVATE KEY") {
			nKeys++
		}
		_ = pem.Encode(&keys, block)
	}
	switch {
	case certs.Len() == 0:
		return nil, nil, fmt.Errorf("%s: %w: no CERTIFICATE block", what, ErrMalformedPEM)
	case nKeys == 0:
		return nil, nil, fmt.Errorf("%s: %w: no private key block", what, ErrMalformedPEM)
	case nKeys > 1:
		return nil, nil, fmt.Errorf("%s: %w: %d private key blocks, want one", what, ErrMalformedPEM, nKeys)
	}
	return certs.Bytes(), keys.Bytes(), nil
}

// CheckValidity reports whether cert is valid at now; a zero now always
// passes.
func CheckValidity(cert *x509.Certificate, now time.Time) error {
	switch {
	case now.IsZero():
		return nil
	case now.After(cert.NotAfter):
		return fmt.Errorf("%w: subject %q, NotAfter %s", ErrExpired, cert.Subject.CommonName, cert.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(cert.NotBefore):
		return fmt.Errorf("%w: subject %q, NotBefore %s", ErrNotYetValid, cert.Subject.CommonName, cert.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// ParseCABundle parses a PEM bundle of one or more CA certificates. Expired
// certificates are kept: during a CA rotation a bundle legitimately holds
// CAs at every stage of their life, and verification checks validity anyway.
func ParseCABundle(bundle []byte) ([]*x509.Certificate, error) {
	if err := checkBlocks(bundle, "CA bundle", isCertBlock); err != nil {
		return nil, err
	}
	var certs []*x509.Certificate
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: CA bundle certificate %d: %v", ErrMalformedPEM, len(certs)+1, err)
		}
		certs = append(certs, cert)
	}
	return certs, nil
}

// NewPool parses bundle into a CertPool.
func NewPool(bundle []byte) (*x509.CertPool, []*x509.Certificate, error) {
	certs, err := ParseCABundle(bundle)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, certs, nil
}

func isCertBlock(b *pem.Block) error {
	if b.Type != "CERTIFICATE" {
		return fmt.Errorf("unexpected PEM block %q, want CERTIFICATE", b.Type)
	}
	return nil
}

func isKeyBlock(b *pem.Block) error {
	switch {
	case b.Type == "ENCRYPTED PRIVATE KEY" || strings.Contains(b.Headers["Proc-Type"], "ENCRYPTED"):
		return ErrEncryptedKey
	case b.Type == "PRIVATE KEY" || b.Type == "RSA PRIVATE KEY" || b.Type == "EC PRIVATE KEY" || b.Type == "EC PARAMETERS":
		return nil
	}
	return fmt.Errorf("unexpected PEM block %q, want a private key", b.Type)
}

// checkBlocks enforces the structural rules that crypto/tls is lenient
// about: some input, a size limit, at least one block, every block of an
// expected type, and nothing but white space after the last block. Text
// before the first block is allowed, as openssl writes "Bag Attributes" there.
func checkBlocks(data []byte, what string, accept func(*pem.Block) error) error {
	switch {
	case len(bytes.TrimSpace(data)) == 0:
		return fmt.Errorf("%s: %w", what, ErrEmpty)
	case len(data) > MaxPEMSize:
		return fmt.Errorf("%s: %w", what, ErrTooLarge)
	}
	n := 0
	rest := data
	for {
		block, r := pem.Decode(rest)
		if block == nil {
			break
		}
		if err := accept(block); err != nil {
			if errors.Is(err, ErrEncryptedKey) {
				return fmt.Errorf("%s: %w", what, err)
			}
			return fmt.Errorf("%s: %w: %v", what, ErrMalformedPEM, err)
		}
		n++
		rest = r
	}
	if n == 0 {
		return fmt.Errorf("%s: %w: no PEM block found", what, ErrMalformedPEM)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return fmt.Errorf("%s: %w: %d bytes of trailing data after the last PEM block", what, ErrMalformedPEM, len(bytes.TrimSpace(rest)))
	}
	return nil
}

func isMismatch(err error) bool {
	return strings.Contains(err.Error(), "does not match")
}
