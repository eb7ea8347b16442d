package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// SignPublicKey issues a server and client leaf certificate, signed by ca,
// to pub: a key someone else holds (a pod's, sent in a certificate signing
// request), so no key is made here. It is valid from notBefore to notAfter
// exactly; X.509 keeps whole seconds, so both are truncated to the second
// first and the certificate's NotBefore and NotAfter equal them. Unlike
// IssueLeaf nothing is backdated or capped: the caller decides the
// validity, and one that is empty or outside the CA's is refused.
func SignPublicKey(ca *Issued, pub crypto.PublicKey, commonName string, dnsNames []string, notBefore, notAfter time.Time) (*x509.Certificate, []byte, error) {
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return nil, nil, errors.New("signing a public key: no CA")
	}
	if pub == nil {
		return nil, nil, errors.New("signing a public key: no public key")
	}
	notBefore, notAfter = notBefore.Truncate(time.Second), notAfter.Truncate(time.Second)
	switch {
	case !notAfter.After(notBefore):
		return nil, nil, fmt.Errorf("signing %q: NotAfter %s is not after NotBefore %s",
			commonName, notAfter.UTC().Format(time.RFC3339), notBefore.UTC().Format(time.RFC3339))
	case notBefore.Before(ca.Cert.NotBefore) || notAfter.After(ca.Cert.NotAfter):
		return nil, nil, fmt.Errorf("signing %q: validity %s to %s is outside CA %q's (%s to %s)", commonName,
			notBefore.UTC().Format(time.RFC3339), notAfter.UTC().Format(time.RFC3339), ca.Cert.Subject.CommonName,
			ca.Cert.NotBefore.UTC().Format(time.RFC3339), ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := leafTemplate(serial, commonName, dnsNames, nil, notBefore, notAfter, pub)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing %q: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the certificate signed for %q: %w", commonName, err)
	}
	return cert, EncodeCertPEM(der), nil
}
