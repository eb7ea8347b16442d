package dynamiccert

import (
	"crypto/x509"
	"time"
)

// zeroTime asks pki to skip validity-date checks.
var zeroTime time.Time

// clientVerifyOptions mirrors upstream's CA providers: a bundle used through
// VerifyOptions authenticates clients.
func clientVerifyOptions(pool *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{
		Roots:     pool,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
