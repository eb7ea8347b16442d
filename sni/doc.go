// Package sni provides DynamicServingCertificateController, a drop-in
// replacement for k8s.io/apiserver's dynamiccertificates controller of the
// same name, built for a hot path that does no work per handshake.
//
// The controller listens to certificate providers (evercert's dynamiccert
// providers or upstream dynamiccertificates providers, which share the same
// interfaces). When a provider reports a change, a work queue coalesces the
// notifications, and a single worker rebuilds an immutable snapshot:
//
//   - only the providers that reported a change are read again (Enqueue,
//     the periodic resync and RunOnce read them all), and each provider's
//     PEM is parsed once per distinct content and cached, so a provider that
//     did not change is never parsed, logged or counted again;
//   - when no provider's names changed, the new snapshot is derived from the
//     previous one: the new certificates replace the old in copies of what
//     they touch, and the rest is shared, so a rotation among 100,000
//     providers costs milliseconds, not a rebuild of the whole name index;
//   - new content that fails validation is counted in
//     evercert_certificate_load_errors_total and logged once, and the
//     provider's last good certificate stays in service;
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
// Typical use:
//
//	c := sni.NewDynamicServingCertificateController(base, clientCA, serving, sniCerts)
//	if err := c.RunOnce(ctx); err != nil { ... }
//	go c.Run(ctx, 1)
//	srv := &http.Server{TLSConfig: c.TLSConfig()}
//
// The configs the controller hands to crypto/tls are clones of base, not of
// the config http.Server derives from TLSConfig(). In particular
// http.Server adds "h2" to its own config's NextProtos only, so set
// base.NextProtos (for example to []string{"h2", "http/1.1"}) to offer
// HTTP/2.
package sni
