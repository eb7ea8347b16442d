// Package app wires the example server: server.Options plus a loopback
// client that calls the server at a steady rate, a status page, health and
// metrics.
//
// See docs/architecture.md for how the packages fit together.
package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/errlog"
	"github.com/evercert/evercert/loopback"
	"github.com/evercert/evercert/server"
)

// Options are the example server's flags: every server.Options flag plus the
// loopback self-check.
type Options struct {
	*server.Options
	// SelfcheckInterval is how often the loopback client calls the server;
	// 0 disables the self-check. Flag --loopback-selfcheck-interval.
	SelfcheckInterval time.Duration
	// LoopbackValidity is the lifetime of the loopback certificate. Flag
	// --loopback-validity.
	LoopbackValidity time.Duration
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{Options: server.NewOptions(), SelfcheckInterval: time.Second, LoopbackValidity: loopback.DefaultValidity}
}

// AddFlags registers every flag on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Options.AddFlags(fs)
	fs.DurationVar(&o.SelfcheckInterval, "loopback-selfcheck-interval", o.SelfcheckInterval, "How often the server calls itself through its loopback client (counted in evercert_loopback_selfcheck_total). 0 disables.")
	fs.DurationVar(&o.LoopbackValidity, "loopback-validity", o.LoopbackValidity, "Lifetime of the loopback certificate (served only for SNI apiserver-loopback-client); it rotates at 2/3 of it.")
}

// Run serves until ctx is done, or returns the start-up error (a bad flag,
// a port in use) at once. It prints the URL, the CA bundle path and a curl
// line to out once the server listens.
func Run(ctx context.Context, opts *Options, out io.Writer) error {
	lb, err := loopback.NewCertificate(loopback.CertificateConfig{Validity: opts.LoopbackValidity, Clock: opts.Clock})
	if err != nil {
		return fmt.Errorf("--loopback-validity: %w", err)
	}
	// The loopback certificate comes first, so it wins its SNI name.
	serving, err := opts.Build(lb)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	serving.InstallHandlers(mux, lb.HealthCheck())
	mux.Handle("/{$}", statusPage(serving, opts.Clock))

	var wg sync.WaitGroup
	// Deferred calls run last-in first-out: when Serve returns (a failed
	// listen, say) the banner and self-check goroutine is cancelled first,
	// then waited for.
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-serving.Listening():
		}
		printBanner(out, serving.Addr(), opts)
		if opts.SelfcheckInterval > 0 {
			selfcheck(ctx, lb, serving.Addr().String(), opts.SelfcheckInterval)
		}
	})
	return serving.Serve(ctx, mux)
}

// selfcheck calls the server's /healthz/serving-certificate through a
// loopback client built once, every interval until ctx is done, and counts
// the results in evercert_loopback_selfcheck_total. The client keeps
// trusting the server through every loopback rotation.
func selfcheck(ctx context.Context, lb *loopback.Certificate, addr string, interval time.Duration) {
	logger := klog.FromContext(ctx)
	cfg, err := lb.RestConfig(addr, "")
	if err != nil {
		logger.Error(err, "Loopback self-check disabled")
		return
	}
	cfg.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		logger.Error(err, "Loopback self-check disabled")
		return
	}
	rest := client.Discovery().RESTClient()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var failing errlog.Once
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		// A single check, not all of /healthz: the loopback health check
		// itself is in /healthz, and the self-check must measure the TLS
		// path, not echo the health verdict back.
		err := rest.Get().AbsPath("/healthz/serving-certificate").Do(ctx).Error()
		if ctx.Err() != nil {
			return
		}
		certmetrics.LoopbackSelfcheck(err == nil)
		if err != nil {
			failing.Error(logger, err, "Loopback self-check failed")
		} else {
			failing.Recovered(logger, "Loopback self-check recovered")
		}
	}
}

func printBanner(out io.Writer, addr net.Addr, opts *Options) {
	_, port, _ := net.SplitHostPort(addr.String())
	host := opts.BindAddress.String()
	if opts.BindAddress.IsLoopback() || opts.BindAddress.IsUnspecified() {
		host = "localhost"
	}
	url := "https://" + net.JoinHostPort(host, port) + "/"
	fmt.Fprintf(out, "evercert example server listening on %s\n", url)
	if opts.CABundleFile != "" {
		abs, _ := filepath.Abs(opts.CABundleFile)
		fmt.Fprintf(out, "CA bundle (rewritten at every rotation): %s\n", abs)
		fmt.Fprintf(out, "try: curl --cacert %s %s\n", abs, url)
	} else {
		fmt.Fprintf(out, "try: curl -k %s   (pass --ca-bundle-file to get a CA bundle for curl --cacert)\n", url)
	}
}
