package sni

import "k8s.io/apiserver/pkg/server/dynamiccertificates"

// AlternativesProvider is implemented by certificate providers that serve
// their names with more than one key algorithm: authority.SelfSigned and
// authority.Authority with several KeyTypes make an ECDSA and an RSA leaf
// for the same names. The controller serves each alternative next to the
// provider's own certificate, as if it were listed right after it (for the
// serving provider: as another serving certificate), and each client gets
// the first of them its ClientHello supports, ECDSA first. Alternatives is
// read once, when the controller is made; the controller registers as a
// listener on each alternative.
//
// The same happens without this interface when two providers claim a name
// with certificates of different key algorithms; see the package
// documentation.
type AlternativesProvider interface {
	Alternatives() []dynamiccertificates.SNICertKeyContentProvider
}

// alternativesOf returns p's alternatives, or nil.
func alternativesOf(p any) []dynamiccertificates.SNICertKeyContentProvider {
	if a, ok := p.(AlternativesProvider); ok {
		return a.Alternatives()
	}
	return nil
}
