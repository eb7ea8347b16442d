package sni

import (
	"crypto/tls"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// ParsedCertKeyProvider is implemented by certificate providers that parse
// and validate their own content, as all of evercert's providers do. The
// controller then serves the provider's parsed certificate instead of
// parsing the PEM again, so each change is parsed once; it only checks the
// certificate's dates against its own clock.
//
// Parsing makes the provider the owner of its content's reports: it logs
// each change (one Info line), updates evercert's certificate metrics and
// sends its Events, and it reports its own load failures. The controller
// reports none of that for it; it reports only what it parses itself (the
// content of providers that do not implement this interface) and what it
// rejects (a certificate not valid on its clock).
type ParsedCertKeyProvider interface {
	dynamiccertificates.CertKeyContentProvider
	// CurrentParsedCertKeyContent returns what CurrentCertKeyContent
	// returns together with the certificate parsed from it, read at once so
	// that they belong together. cert is nil when there is no content yet;
	// otherwise cert.Leaf is set. None of it may be modified, and the same
	// slices and certificate must be returned until the content changes.
	CurrentParsedCertKeyContent() (certPEM, keyPEM []byte, cert *tls.Certificate)
}
