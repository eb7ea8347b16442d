package sni_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/sni"
)

// Example serves a self-signed default certificate and a second, rotating
// certificate selected by SNI from a plain net/http server.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{Hosts: []string{"localhost", "127.0.0.1"}})
	if err != nil {
		panic(err)
	}
	api, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: "api", Hosts: []string{"api.example.test"}})
	if err != nil {
		panic(err)
	}
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{
		Serving: serving, // the default certificate
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{api},
		// Base defaults to TLS 1.2 or later with HTTP/2 offered; no ClientCA.
	})
	if err != nil {
		panic(err)
	}
	if err := ctrl.RunOnce(ctx); err != nil {
		panic(err)
	}
	go serving.Run(ctx, 1)
	go api.Run(ctx, 1)
	go ctrl.Run(ctx, 1)

	srv := &http.Server{
		Addr:      "127.0.0.1:0",
		TLSConfig: ctrl.TLSConfig(),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, "hello")
		}),
	}
	_ = srv // srv.ListenAndServeTLS("", "") serves until shut down.

	for _, c := range ctrl.Served() {
		fmt.Println(c.Provider, c.Role, c.IsDefault)
	}
	// Output:
	// self-signed serving true
	// api sni false
}

// ExampleDynamicServingCertificateController_SetGetCertificate plugs the
// controller into a framework that owns the tls.Config and takes options,
// such as controller-runtime's webhook.Options.TLSOpts: only the
// certificate comes from evercert, so the framework's client CA, MinVersion
// and HTTP/2 setting stay in force.
func ExampleDynamicServingCertificateController_SetGetCertificate() {
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{Hosts: []string{"webhook.example.svc"}})
	if err != nil {
		panic(err)
	}
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: serving})
	if err != nil {
		panic(err)
	}
	if err := ctrl.RunOnce(context.Background()); err != nil {
		panic(err)
	}
	// webhook.Options{TLSOpts: tlsOpts} in controller-runtime.
	tlsOpts := []func(*tls.Config){ctrl.SetGetCertificate}

	cfg := &tls.Config{}
	for _, opt := range tlsOpts {
		opt(cfg)
	}
	cert, err := cfg.GetCertificate(&tls.ClientHelloInfo{ServerName: "webhook.example.svc"})
	fmt.Println(err == nil, cert.Leaf.DNSNames)
	// Output: true [webhook.example.svc]
}
