package authority

import (
	"crypto/x509"
	"time"
)

// zeroTime asks pki.ParseCertKey to skip the validity-date checks, for
// pairs whose dates whoever uses them checks on its own clock (a CA read
// from a Secret), as in dynamiccert.
var zeroTime time.Time

// clientVerifyOptions mirrors upstream's CA providers, as dynamiccert's
// providers do: a bundle used through VerifyOptions authenticates clients.
func clientVerifyOptions(pool *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{
		Roots:     pool,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}
