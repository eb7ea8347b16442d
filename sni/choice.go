package sni

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"slices"
)

// choice is what a name, a local IP or the default selects from: one
// certificate, or, when certificates with different key algorithms claim
// it, one per algorithm in order of preference (ECDSA first). Choices are
// immutable once built: snapshots share them, and a single-certificate
// choice is made once per parse and reused by every snapshot and every name
// of that certificate.
type choice struct {
	// certs is never empty and is ordered by keyRank, one per rank.
	certs []*tls.Certificate
	// owner is set on a name-only provider's names (NameOnlyProvider) to
	// that provider's slot: only its own alternatives join them.
	owner *certSlot
}

// Key algorithm ranks, in order of preference: an ECDSA handshake costs the
// server about half of an RSA one, and Ed25519 is as cheap but fewer
// clients support it.
const (
	rankECDSA = iota
	rankEd25519
	rankRSA
	rankOther
)

// keyRank returns the preference rank of cert's key algorithm. cert.Leaf
// is always set on parsed certificates (pki.ParseCertKey).
func keyRank(cert *tls.Certificate) int {
	switch cert.Leaf.PublicKey.(type) {
	case *ecdsa.PublicKey:
		return rankECDSA
	case ed25519.PublicKey:
		return rankEd25519
	case *rsa.PublicKey:
		return rankRSA
	default:
		return rankOther
	}
}

// pick returns the certificate to serve to hello. With one certificate it
// returns it at once; that is every name in a deployment with one key
// algorithm, and it does not allocate. With several it returns the first
// that hello.SupportsCertificate accepts, and the first when none is: the
// handshake then fails in crypto/tls as it would have with that certificate
// alone.
func (c *choice) pick(hello *tls.ClientHelloInfo) *tls.Certificate {
	if len(c.certs) == 1 {
		return c.certs[0]
	}
	return pickSupported(c.certs, hello)
}

// pickSupported asks SupportsCertificate about each certificate with the
// server name cleared: the index has already matched the name, and the
// hostname check would reject every candidate for an explicit name their
// certificates do not carry, and for the default; it also allocates.
func pickSupported(certs []*tls.Certificate, hello *tls.ClientHelloInfo) *tls.Certificate {
	probe := *hello
	probe.ServerName = ""
	for _, cert := range certs {
		if probe.SupportsCertificate(cert) == nil {
			return cert
		}
	}
	return certs[0]
}

// join returns the choice with cert added when no certificate of its key
// algorithm is there yet, and c itself otherwise: the earlier claim keeps
// a name against a certificate of the same algorithm. owner is the
// name-only provider's slot cert belongs to, or nil: a name-only choice
// takes only the alternatives of its own provider, and a name-only
// certificate joins only its own provider's names.
func (c *choice) join(cert *tls.Certificate, owner *certSlot) *choice {
	if c.owner != owner {
		return c
	}
	rank := keyRank(cert)
	i, found := slices.BinarySearchFunc(c.certs, rank, func(have *tls.Certificate, rank int) int { return keyRank(have) - rank })
	if found {
		return c
	}
	return &choice{certs: slices.Insert(slices.Clone(c.certs), i, cert), owner: c.owner}
}

// has reports whether cert is one of c's certificates.
func (c *choice) has(cert *tls.Certificate) bool {
	return c != nil && slices.Contains(c.certs, cert)
}
