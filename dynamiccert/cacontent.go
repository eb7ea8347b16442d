package dynamiccert

import "crypto/x509"

// caContent is a CA bundle a provider serves: the PEM it hands out, the
// certificates parsed from it and options verifying against them. It is
// immutable once stored.
type caContent struct {
	bundle []byte
	certs  []*x509.Certificate
	opts   x509.VerifyOptions
}

// clientVerifyOptions mirrors upstream's CA providers: a bundle used through
// VerifyOptions authenticates clients.
func clientVerifyOptions(pool *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{
		Roots:     pool,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}
