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
package server
