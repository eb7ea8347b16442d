package authority

import (
	"crypto"
	"crypto/x509"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/evercert/evercert/internal/pki"
)

// costly holds the costly calls of the rotation: every check parses the CA
// Secret, every replica signs its Lease renewals, and every replica
// verifies every renewal of every peer. They are variables for one reason:
// the simulator (simulate_test.go) runs many replicas in one process and
// memoizes the pure ones by input, so each distinct input is still parsed
// or verified for real, once, and a signature its replicas make (of an
// announcement, or of a leaf by its CA) is known to verify. Production
// code never changes them.
var costly = struct {
	// parseCA parses a CA certificate and its key (parseCAPair).
	parseCA func(certPEM, keyPEM []byte) (*pki.Issued, error)
	// parseBundle parses a PEM bundle of CA certificates.
	parseBundle func(pemBytes []byte) ([]*x509.Certificate, error)
	// parseCert parses one DER certificate.
	parseCert func(der []byte) (*x509.Certificate, error)
	// parseLeaf parses the leaf a Lease announces (parseAnnouncedLeaf).
	parseLeaf func(s string) *x509.Certificate
	// fingerprint is Fingerprint: a SHA-256 of the certificate, which
	// every check asks of the same few CAs many times.
	fingerprint func(c *x509.Certificate) string
	// signedBy reports whether ca's key signed cert.
	signedBy func(cert, ca *x509.Certificate) bool
	// verify checks an announcement's signature (verifyAnnouncementSignature).
	// It keeps none of its arguments: checkSignedAnnouncement reuses msg's
	// buffer.
	verify func(pub crypto.PublicKey, msg, sig []byte) error
	// sign signs a replica's own announcement (signAnnouncement).
	sign func(l *coordinationv1.Lease, key crypto.Signer) error
	// issueLeaf issues a serving leaf signed by ca (pki.IssueLeaf): the
	// simulator learns from it that ca signed the leaf, which
	// x509.CreateCertificate has just verified.
	issueLeaf func(ca *pki.Issued, r pki.Request) (*pki.Issued, error)
}{
	parseCA:     parseCAPair,
	parseBundle: pki.ParseCABundle,
	parseCert:   x509.ParseCertificate,
	parseLeaf:   parseAnnouncedLeaf,
	fingerprint: fingerprint,
	signedBy:    func(cert, ca *x509.Certificate) bool { return cert.CheckSignatureFrom(ca) == nil },
	verify:      verifyAnnouncementSignature,
	sign:        signAnnouncement,
	issueLeaf:   pki.IssueLeaf,
}
