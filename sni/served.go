package sni

import (
	"crypto/x509"
	"slices"
	"time"
)

// Roles reported in ServedCertificate.Role.
const (
	// RoleServing is the serving (default) certificate provider, and the
	// providers of its alternatives (AlternativesProvider).
	RoleServing = "serving"
	// RoleSNI is an SNI certificate provider.
	RoleSNI = "sni"
	// RoleClientCA is one CA certificate of the client CA bundle.
	RoleClientCA = "client-ca"
)

// ServedCertificate describes one certificate in the current snapshot, for
// status pages and health checks. Values returned by Served are copies; they
// can be kept and modified freely.
type ServedCertificate struct {
	// Provider is the provider's Name().
	Provider string
	// Role is RoleServing, RoleSNI or RoleClientCA.
	Role string
	// Subject is the certificate's subject common name.
	Subject string
	// KeyAlgorithm is the algorithm of the certificate's public key:
	// "ECDSA", "RSA" or "Ed25519".
	KeyAlgorithm string
	// Names are the SNI names (and explicit IPs) this certificate is selected
	// for, in the order the provider claimed them, including names it
	// serves as the alternative of another key algorithm. Names won by an
	// earlier provider with the same key algorithm are not listed. For a
	// serving certificate, the names an SNI provider claimed that it is
	// served for too, to clients of its key algorithm; empty for client CAs.
	Names []string
	// Serial is the serial number in lower-case hexadecimal.
	Serial string
	// NotBefore and NotAfter are the certificate's validity bounds.
	NotBefore time.Time
	NotAfter  time.Time
	// IsDefault is true for the certificate served when no name matches,
	// and for its alternatives of other key algorithms.
	IsDefault bool
}

func describe(provider, role string, cert *x509.Certificate) ServedCertificate {
	return ServedCertificate{
		Provider:     provider,
		Role:         role,
		Subject:      cert.Subject.CommonName,
		KeyAlgorithm: cert.PublicKeyAlgorithm.String(),
		Serial:       cert.SerialNumber.Text(16),
		NotBefore:    cert.NotBefore,
		NotAfter:     cert.NotAfter,
	}
}

// servedCopy expands the snapshot's compact description into a fresh
// slice the caller owns; the snapshot is shared with concurrent readers and
// must not be reachable from it.
func (s *snapshot) servedCopy() []ServedCertificate {
	out := make([]ServedCertificate, 0, s.served.len()+len(s.clientCAs))
	for i := range s.served.len() {
		e := s.served.at(i)
		d := *e.desc
		d.Names = slices.Clone(e.names)
		d.IsDefault = slices.Contains(s.defaults, i)
		out = append(out, d)
	}
	return append(out, s.clientCAs...)
}
