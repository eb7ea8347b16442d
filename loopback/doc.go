// Package loopback gives a genericapiserver a loopback certificate that
// rotates in memory, and a loopback rest.Config whose TLS trust follows that
// rotation, so the server's calls to itself never fail on an expired
// certificate (kubernetes/kubernetes#86552).
//
// Upstream k8s.io/apiserver (SecureServingOptionsWithLoopback.ApplyTo) makes
// one self-signed loopback certificate at start-up from two RSA-2048 keys,
// never rotates it, and pins it in the loopback rest.Config's CAData, which
// client-go never reloads. This package replaces that:
//
//   - New makes a Certificate: a CA and a leaf for the server name
//     ServerName ("apiserver-loopback-client"), kept and rotated in memory by
//     a authority.SelfSigned (ECDSA P-256 by default, a few hundred
//     microseconds). The leaf is served for that SNI name only.
//   - (*Certificate).RestConfig returns a rest.Config (Host, random bearer
//     token, QPS -1, as upstream) whose every new TLS connection is verified
//     against the Certificate's current CA bundle at the Certificate clock's
//     time. A clientset built once keeps working through any number of leaf
//     and CA rotations.
//   - ApplyTo and ApplyToConfig are drop-in replacements for the loopback
//     part of SecureServingOptionsWithLoopback.ApplyTo / ApplyToConfig.
//   - ApplyRecommendedOptions replaces RecommendedOptions.ApplyTo (the call
//     sample-apiserver, metrics-server and most aggregated API servers make):
//     secure serving without upstream's loopback, a rotating serving
//     certificate of the caller's choice (self-signed in memory by default),
//     evercert's loopback, then the rest of RecommendedOptions, so that the
//     admission initializers and informers built there use evercert's
//     loopback client config.
//   - A loopback applied twice or in the wrong order (upstream's, then
//     evercert's, or the reverse) is an error wrapping ErrWrongOrder, never
//     a server whose loopback client trusts one certificate while it serves
//     another.
//   - HealthCheck is the "loopback-serving-certificate" check: it reports the
//     time left on the certificate and fails only when rotation has stalled.
//
// A minimal wiring, after the usual SecureServingOptions.ApplyTo:
//
//	if err := secureServing.ApplyTo(&cfg.SecureServing); err != nil { ... }
//	cert, err := loopback.ApplyToConfig(cfg, loopback.CertificateConfig{})
//
// With RecommendedOptions, instead of o.RecommendedOptions.ApplyTo(cfg):
//
//	applied, err := loopback.ApplyRecommendedOptions(o.RecommendedOptions, cfg, loopback.ApplyConfig{})
//
// Rotation runs in (*Certificate).Run. A genericapiserver starts Run for every
// SNI certificate provider that implements ControllerRunner when it starts
// serving, bounded by the server's stop channel; ApplyToConfig additionally
// registers the post-start hook PostStartHookName, so rotation does not
// depend on that detail. Run never runs twice at once.
//
// See docs/architecture.md for how the packages fit together.
package loopback
