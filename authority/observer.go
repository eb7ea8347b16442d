package authority

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"

	"github.com/evercert/evercert/internal/pki"
)

// Observer confirms that a published CA has reached the consumers it stands
// for: a caBundle publisher that has read its targets back, a bundle file
// that was written, the replicas of an Authority. A successor CA signs only
// once every observer of its issuer confirms it (observed rotation; see the
// package documentation).
//
// An Observer that also implements dynamiccertificates.Notifier is watched:
// the issuer registers itself as a listener and, while a successor waits,
// re-checks at once when the observer notifies, so a confirmation promotes
// the successor promptly instead of at the next periodic check.
// Notifications while no successor waits cost nothing.
type Observer interface {
	// Name identifies the observer in status, health output, logs and
	// metrics, e.g. "cabundle" or "ca-bundle-file".
	Name() string
	// Observed reports whether every consumer the observer stands for now
	// holds ca in the bundle it trusts. It must be cheap (no API call: read
	// a cache) and safe for concurrent use.
	Observed(ca *x509.Certificate) bool
}

// Fingerprint is the identity of a CA certificate in announcements and
// status: the first 16 bytes of the SHA-256 of its DER, hex encoded.
func Fingerprint(c *x509.Certificate) string { return costly.fingerprint(c) }

// fingerprint is Fingerprint's computation. Callers go through
// costly.fingerprint.
func fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:16])
}

// BundleHolds reports whether the PEM bundle holds ca. Bundles that fail to
// parse hold nothing.
func BundleHolds(bundle []byte, ca *x509.Certificate) bool {
	certs, err := pki.ParseCABundle(bundle)
	if err != nil {
		return false
	}
	for _, c := range certs {
		if c.Equal(ca) {
			return true
		}
	}
	return false
}
