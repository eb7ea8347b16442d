package sni

import (
	"net/netip"
	"slices"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// NameOnlyProvider is implemented by SNI providers whose certificate is an
// internal identity rather than the server's own, such as the apiserver
// loopback certificate. When NameOnly returns true the controller serves
// that certificate only to a client that sends one of the provider's
// explicit SNINames:
//
//   - it is never the default certificate, whatever the order of the
//     providers, so a client sending no SNI or an unknown name never sees it;
//   - IP addresses among its SNINames are ignored, so it is never selected
//     for a local IP either;
//   - it wins its names over every other provider, whatever their order,
//     and no certificate of another key algorithm joins them but its own
//     alternatives (AlternativesProvider), which are name-only too.
//
// A name-only provider without explicit SNINames is never selected. If only
// name-only providers have valid content, there is nothing to serve by
// default and the controller does not become ready: it fails closed rather
// than present an internal identity. NameOnly is read once, when the
// controller is made.
type NameOnlyProvider interface {
	dynamiccertificates.SNICertKeyContentProvider
	NameOnly() bool
}

// isNameOnly reports whether p asked to be served for its names only.
func isNameOnly(p dynamiccertificates.SNICertKeyContentProvider) bool {
	n, ok := p.(NameOnlyProvider)
	return ok && n.NameOnly()
}

// withoutIPs drops IP literals from the explicit names of a name-only slot.
func withoutIPs(names []string) []string {
	return slices.DeleteFunc(names, func(n string) bool {
		_, err := netip.ParseAddr(n)
		return err == nil
	})
}
