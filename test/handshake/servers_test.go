// Package handshake measures TLS handshakes from outside the server
// process: the example server (./example/server, evercert's controller
// behind net/http) side by side with the same net/http server on a static
// tls.Config, on upstream's DynamicServingCertificateController and on
// evercert's server package, and with the example server's own code, all
// serving the same certificate files. The comparison servers are copies of
// this test binary, started with the argument "serve" (see TestMain and
// startTargets), so every server is a separate process from a file of its
// own, and the client's work never shares a process or code pages with the
// server it measures.
package handshake

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	cliflag "k8s.io/component-base/cli/flag"

	"github.com/evercert/evercert/example/server/app"
	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/server"
)

// serveCommand, as the test binary's first argument, makes it a
// comparison server instead of running tests.
const serveCommand = "serve"

// Kinds of comparison server.
const (
	kindStatic   = "static"
	kindUpstream = "upstream"
	// kindLibrary is evercert's server package (server.Options.Build, the
	// sni controller and file providers) behind this binary's http.Server:
	// the library without the example server's process around it.
	kindLibrary = "library"
	// kindExampleApp is the example server's own code (example/server/app,
	// which its main calls) run from this binary: the example server
	// without its separately built binary.
	kindExampleApp = "example-app"
)

// TestMain runs the test binary as a comparison server when its first
// argument is serveCommand, and runs the tests otherwise (removing the
// binaries they build and copy).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == serveCommand {
		if err := serve(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(proctest.Main(m))
}

// serveFlags are the example server's certificate flags, with the same
// names and meaning, so that all three servers get the same arguments.
type serveFlags struct {
	kind     string
	certFile string
	keyFile  string
	sni      []cliflag.NamedCertKey
	clientCA string
}

// serve runs a comparison server on 127.0.0.1 (free port) until SIGTERM:
// an http.Server whose TLS config is static (kind "static") or comes from
// upstream's controller (kind "upstream"). Like the example server, it
// logs "serving on https://ADDR" once it listens, verifies a client
// certificate if one is presented and --client-ca-file is set, and offers
// h2 and http/1.1. Every request gets 200 "ok".
func serve(args []string) error {
	if len(args) > 0 && args[0] == "--kind="+kindExampleApp {
		return serveExampleApp(args[1:])
	}
	var f serveFlags
	fs := pflag.NewFlagSet(serveCommand, pflag.ContinueOnError)
	fs.StringVar(&f.kind, "kind", "", "static, upstream, library, or example-app (then the first argument)")
	fs.StringVar(&f.certFile, "tls-cert-file", "", "serving certificate")
	fs.StringVar(&f.keyFile, "tls-private-key-file", "", "serving key")
	fs.Var(cliflag.NewNamedCertKeyArray(&f.sni), "tls-sni-cert-key", "SNI certificate and key, as the example server takes them")
	fs.StringVar(&f.clientCA, "client-ca-file", "", "client CA bundle")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.certFile == "" || f.keyFile == "" {
		return errors.New("--tls-cert-file and --tls-private-key-file are required")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	if f.clientCA != "" {
		// The example server's default with a client CA.
		base.ClientAuth = tls.VerifyClientCertIfGiven
	}
	var (
		cfg  *tls.Config
		done func()
		err  error
	)
	switch f.kind {
	case kindStatic:
		cfg, err = staticConfig(base, f)
		done = func() {}
	case kindUpstream:
		cfg, done, err = upstreamConfig(ctx, base, f)
	case kindLibrary:
		cfg, done, err = libraryConfig(ctx, f)
	default:
		err = fmt.Errorf("--kind: want %s, %s, %s or %s, got %q", kindStatic, kindUpstream, kindLibrary, kindExampleApp, f.kind)
	}
	if err != nil {
		return err
	}
	defer done()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 30 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	fmt.Fprintf(os.Stderr, "%s server: serving on https://%s\n", f.kind, ln.Addr())
	select {
	case err := <-served:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// staticConfig loads every certificate once: the serving one first, so it
// is the default, then the SNI ones, which crypto/tls selects by the names
// in the certificates.
func staticConfig(base *tls.Config, f serveFlags) (*tls.Config, error) {
	cfg := base.Clone()
	files := append([]cliflag.NamedCertKey{{CertFile: f.certFile, KeyFile: f.keyFile}}, f.sni...)
	for _, nck := range files {
		pair, err := tls.LoadX509KeyPair(nck.CertFile, nck.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading %s: %w", nck.CertFile, err)
		}
		cfg.Certificates = append(cfg.Certificates, pair)
	}
	if f.clientCA != "" {
		bundle, err := os.ReadFile(f.clientCA)
		if err != nil {
			return nil, fmt.Errorf("--client-ca-file: %w", err)
		}
		cfg.ClientCAs = x509.NewCertPool()
		if !cfg.ClientCAs.AppendCertsFromPEM(bundle) {
			return nil, fmt.Errorf("--client-ca-file %s: no certificates", f.clientCA)
		}
	}
	return cfg, nil
}

// upstreamConfig wires upstream's file providers and controller the way a
// genericapiserver does (SecureServingInfo.tlsConfig): each provider is
// primed and run, the controller listens to them and is run, and the
// listener's config takes the controller's GetConfigForClient. The returned
// func stops them.
func upstreamConfig(ctx context.Context, base *tls.Config, f serveFlags) (*tls.Config, func(), error) {
	serving, err := dynamiccertificates.NewDynamicServingContentFromFiles("serving-cert", f.certFile, f.keyFile)
	if err != nil {
		return nil, nil, err
	}
	runners := []dynamiccertificates.ControllerRunner{serving}
	notifiers := []dynamiccertificates.Notifier{serving}
	var sniCerts []dynamiccertificates.SNICertKeyContentProvider
	for _, nck := range f.sni {
		p, err := dynamiccertificates.NewDynamicSNIContentFromFiles("sni-serving-cert::"+nck.CertFile, nck.CertFile, nck.KeyFile, nck.Names...)
		if err != nil {
			return nil, nil, err
		}
		sniCerts = append(sniCerts, p)
		runners = append(runners, p)
		notifiers = append(notifiers, p)
	}
	var clientCA dynamiccertificates.CAContentProvider
	if f.clientCA != "" {
		p, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca-bundle", f.clientCA)
		if err != nil {
			return nil, nil, err
		}
		clientCA = p
		runners = append(runners, p)
		notifiers = append(notifiers, p)
	}
	ctrl := dynamiccertificates.NewDynamicServingCertificateController(base, clientCA, serving, sniCerts, nil)
	for _, n := range notifiers {
		n.AddListener(ctrl)
	}
	if err := ctrl.RunOnce(); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Go(func() { r.Run(ctx, 1) })
	}
	wg.Go(func() { ctrl.Run(1, ctx.Done()) })
	cfg := base.Clone()
	cfg.GetConfigForClient = ctrl.GetConfigForClient
	return cfg, func() { cancel(); wg.Wait() }, nil
}

// libraryConfig builds evercert's server package from the same flags as
// the example server takes them, and runs its loops. The returned func
// stops them.
func libraryConfig(ctx context.Context, f serveFlags) (*tls.Config, func(), error) {
	o := server.NewOptions()
	o.CertFile, o.KeyFile, o.SNICertKeys, o.ClientCAFile = f.certFile, f.keyFile, f.sni, f.clientCA
	s, err := o.Build()
	if err != nil {
		return nil, nil, err
	}
	if err := s.RunOnce(ctx); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx, 1) })
	return s.Controller.TLSConfig(), func() { cancel(); wg.Wait() }, nil
}

// serveExampleApp runs the example server's app with the example server's
// flags, as its main does (without component-base's logging flags), until
// SIGTERM.
func serveExampleApp(args []string) error {
	o := app.NewOptions()
	fs := pflag.NewFlagSet(kindExampleApp, pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return app.Run(ctx, o, os.Stderr)
}
