// Package server is secure serving for evercert: kube-apiserver style flags
// (Options), the providers and sni controller built from them (Serving), an
// HTTPS server with graceful shutdown (Serving.Serve), health checks and the
// /metrics endpoint.
//
// With no certificate flag a server serves an in-memory self-signed
// certificate for localhost, 127.0.0.1 and ::1 that rotates by itself: the
// embedded default.
//
//	opts := server.NewOptions()
//	opts.AddFlags(pflag.CommandLine)
//	pflag.Parse()
//	serving, err := opts.Build()
//	...
//	mux := http.NewServeMux()
//	serving.InstallHandlers(mux)
//	err = serving.Serve(ctx, mux)
//
// An embedder that runs its own server (a genericapiserver, say) calls
// Serving.RunOnce, which fails fast, then Serving.Run(ctx, workers), and
// serves Serving.Controller's configuration; Serving.HasSynced says when a
// certificate is loaded. This is the lifecycle every evercert type has:
// RunOnce where a synchronous first load makes sense, Run(ctx, workers)
// until ctx is done, HasSynced for readiness.
//
// See docs/architecture.md for how the packages fit together.
//
// # Start-up errors
//
// Serve returns start-up errors at once instead of serving nothing: no
// certificate, an unloadable --client-ca-file, an unwritable
// --ca-bundle-file, a port in use ("listening on HOST:PORT: ..."), or a TLS
// configuration net/http refuses ("serving on HOST:PORT: ...").
// Options.Validate already refuses what it can: HTTP/2 is
// always served, so below TLS 1.3 a --tls-cipher-suites list must contain
// TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 or
// TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, as net/http's HTTP/2 server
// requires; a list without either is refused, naming the flag, rather than
// HTTP/2 being switched off. Go's insecure suites (tls.InsecureCipherSuites)
// are refused too, and --help does not offer them.
//
// # Health endpoints
//
// InstallHandlers serves /livez, /readyz and /healthz:
//
//   - serving-certificate (fails before the first certificate is loaded and
//     while any served certificate has expired) is on /readyz and /healthz,
//     not /livez: an expired certificate from a file or a Secret comes back
//     unchanged after a restart, so on /livez it would only restart-loop
//     the pod.
//   - client-ca, with --client-ca-file (fails while no client CA bundle is
//     loaded, or when every CA of it has expired), is on /readyz and
//     /healthz too. The file must load at start-up (Serve fails, naming
//     the flag and the file); a later bad write keeps the last good bundle
//     and is counted, not failed (see ClientCACheck).
//   - a caller's liveness checks (InstallHandlers' checks, or
//     HealthChecks.Liveness) are on all three.
//   - a caller's readiness checks (HealthChecks.Readiness, through
//     InstallHandlersWithChecks) are on /readyz and /healthz only.
//
// Probe /livez for liveness and /readyz for readiness; /healthz is the
// legacy endpoint that reports every check.
//
// # CA bundle file
//
// With --ca-bundle-file the trust bundle is written at start-up (failure is
// a start-up error) and at every change. A later failed write is retried
// with exponential backoff and jitter (1s doubling to 5 min) on
// Options.Clock until it succeeds; each distinct error is logged once, and
// every write is counted in
// evercert_cabundle_publish_total{kind="CABundleFile",result="success"|"error"}.
package server
