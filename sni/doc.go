// Package sni provides DynamicServingCertificateController, a drop-in
// replacement for k8s.io/apiserver's dynamiccertificates controller of the
// same name, built for a hot path that does no work per handshake.
//
// The controller listens to certificate providers (evercert's dynamiccert and authority
// providers or upstream dynamiccertificates providers, which share the same
// interfaces). When a provider reports a change, a work queue coalesces the
// notifications, and a single worker rebuilds an immutable snapshot:
//
//   - only the providers that reported a change are read again (Enqueue,
//     the periodic resync and RunOnce read them all);
//   - a provider that parses its own content (ParsedCertKeyProvider: all of
//     evercert's) hands over its parsed certificate, which is served as is,
//     and reports its own changes; other providers' PEM is parsed here, once
//     per distinct content, and each change is reported here: one Info line
//     (provider, subject, serial, NotAfter, issuer), the certificate
//     metrics, and with WithEventRecorder a CertificateRotated Event. A
//     provider that did not change is never parsed, logged or counted again;
//   - when no provider's names, SANs or key algorithm changed, the new
//     snapshot is derived from the previous one: each new certificate
//     replaces the old one inside the choices that held it (keeping the
//     other key algorithms' certificates), in copies of what it touches, and
//     the rest is shared, so a rotation among 100,000 providers costs
//     milliseconds, not a rebuild of the whole name index;
//   - content the controller rejects (malformed, or not valid on its clock)
//     is counted in evercert_certificate_load_errors_total, logged and sent
//     as an Event once per distinct content and error, and the provider's
//     last good certificate stays in service;
//   - the snapshot holds the SNI name index, the default certificate, the
//     client CA pool and one prepared *tls.Config.
//
// The snapshot is swapped in through an atomic pointer. GetConfigForClient
// returns the snapshot's shared *tls.Config without cloning it (0
// allocations), and that config's GetCertificate selects a certificate in
// this order:
//
//  1. an exact, case-insensitive match on the SNI name;
//  2. a single-label wildcard (*.example.com matches a.example.com, but not
//     a.b.example.com or example.com);
//  3. with no SNI, the IP of the local address, if a provider registered it
//     as an explicit name;
//  4. the default certificate: the serving certificate, or, when there is
//     none, the first SNI certificate in the order given, so the choice is
//     always the same.
//
// A provider that implements NameOnlyProvider (the loopback certificate
// does) is an internal identity: it is served only for its explicit SNI
// names, which it wins over every other provider, and never as the default
// or for an IP.
//
// Names follow upstream's rules: names given explicitly with a provider
// (SNINames) replace the names taken from its certificate, which are the
// subject CN when it is a DNS name plus the DNS SANs (IP SANs are not
// indexed). Explicit names take precedence over names taken from
// certificates, and within each kind the earlier provider wins a name.
//
// See docs/architecture.md for how the packages fit together.
//
// # Several key algorithms for one name
//
// Some clients cannot use ECDSA (legacy or restricted TLS stacks), while an
// ECDSA handshake costs the server about half of an RSA one. So a name can
// carry one certificate per key algorithm (ECDSA, Ed25519, RSA), and each
// client gets the first one its ClientHello supports
// (tls.ClientHelloInfo.SupportsCertificate), ECDSA first; when none fits,
// the first is served and crypto/tls fails the handshake as it would have.
//
//   - When a provider claims a name that a certificate of another key
//     algorithm already holds, it joins that name as an alternative instead
//     of losing it. Against a certificate of the same algorithm the earlier
//     claim still wins.
//   - The serving certificate claims no names, but joins the names an SNI
//     provider claimed that it is valid for (its CN, DNS and IP SANs).
//   - The default's alternatives are the certificates of other algorithms
//     with exactly the same DNS and IP SANs: the serving provider's
//     alternatives first, then SNI certificates in order.
//   - A name-only provider's names are its alone: only its own
//     alternatives (AlternativesProvider) join them, and they are
//     name-only too.
//   - A provider that implements AlternativesProvider (authority.SelfSigned
//     and Authority with several KeyTypes) has its alternatives served as if
//     listed right after it.
//
// A name with one certificate, the common case, costs nothing more per
// handshake; see GetCertificate for the cost of choosing among several.
//
// Typical use:
//
//	c, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{
//		Serving: serving, SNI: sniCerts, ClientCA: clientCA,
//	})
//	if err != nil { ... }
//	if err := c.RunOnce(ctx); err != nil { ... }
//	go c.Run(ctx, 1)
//	srv := &http.Server{TLSConfig: c.TLSConfig()}
//
// The configs the controller hands to crypto/tls are clones of
// ControllerConfig.Base, not of the config http.Server derives from
// TLSConfig(). http.Server adds "h2" to its own config's NextProtos only, so
// the default Base (nil) offers "h2" and "http/1.1" itself, and a Base you
// set must list "h2" in NextProtos to offer HTTP/2.
package sni
