package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// ErrNotFIPSApproved is wrapped by the FIPS checks below: the key cannot be
// used by crypto/tls in FIPS 140-3 mode (GODEBUG=fips140=on or only).
var ErrNotFIPSApproved = errors.New("not approved in FIPS 140-3 mode")

// CheckFIPSPublicKey reports whether a certificate's public key is one that
// Go's crypto/tls accepts in FIPS 140-3 mode, and that Go's FIPS 140-3 module
// signs and verifies with under GODEBUG=fips140=only: RSA of at least 2048
// bits (even size, odd public exponent above 2^16), ECDSA on P-256, P-384
// or P-521, or Ed25519 (FIPS 186-5). These are the rules of crypto/tls
// (isCertificateAllowedFIPS, Go 1.26) and of crypto/rsa's FIPS 140-only
// checks. Every KeyType this package generates passes.
func CheckFIPSPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		bits := k.N.BitLen()
		switch {
		case bits < 2048:
			return fmt.Errorf("%w: RSA %d-bit key (RSA needs at least 2048 bits)", ErrNotFIPSApproved, bits)
		case bits%2 == 1:
			return fmt.Errorf("%w: RSA key of odd size %d bits", ErrNotFIPSApproved, bits)
		case k.E <= 1<<16 || k.E%2 == 0:
			return fmt.Errorf("%w: RSA public exponent %d (it must be odd and above 65536)", ErrNotFIPSApproved, k.E)
		}
		return nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return nil
		}
		name := "an unknown curve"
		if k.Curve != nil && k.Curve.Params() != nil {
			name = k.Curve.Params().Name
		}
		return fmt.Errorf("%w: ECDSA key on %s (ECDSA needs P-256, P-384 or P-521)", ErrNotFIPSApproved, name)
	case ed25519.PublicKey:
		return nil
	default:
		return fmt.Errorf("%w: %T key", ErrNotFIPSApproved, pub)
	}
}

// CheckFIPSCertificates checks the public key of every certificate (a
// served chain or a CA bundle) with CheckFIPSPublicKey; the error names the
// first certificate that fails by its subject.
func CheckFIPSCertificates(certs []*x509.Certificate) error {
	for i, c := range certs {
		if err := CheckFIPSPublicKey(c.PublicKey); err != nil {
			return fmt.Errorf("certificate %d (subject %q): %w", i+1, c.Subject.String(), err)
		}
	}
	return nil
}

// CheckFIPSKeyPair checks a parsed serving certificate for FIPS 140-3 mode:
// every certificate of its chain (crypto/tls clients in FIPS mode refuse a
// chain with any unapproved key in it) and its private key (Go's FIPS
// 140-only mode refuses multi-prime RSA keys and primes of unequal size).
func CheckFIPSKeyPair(c tls.Certificate) error {
	certs := make([]*x509.Certificate, 0, len(c.Certificate))
	for i, der := range c.Certificate {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("certificate %d: %w", i+1, err)
		}
		certs = append(certs, cert)
	}
	if err := CheckFIPSCertificates(certs); err != nil {
		return err
	}
	if k, ok := c.PrivateKey.(*rsa.PrivateKey); ok {
		if len(k.Primes) != 2 {
			return fmt.Errorf("private key: %w: multi-prime RSA key (%d primes)", ErrNotFIPSApproved, len(k.Primes))
		}
		if k.Primes[0].BitLen() != k.Primes[1].BitLen() {
			return fmt.Errorf("private key: %w: RSA key with primes of unequal size", ErrNotFIPSApproved)
		}
	}
	return nil
}
