// Package app wires the example server: server.Options plus a loopback
// client that calls the server at a steady rate, a status page, health and
// metrics.
package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/evercert/evercert/server"
)

// Options are the example server's flags: every server.Options flag plus the
// loopback self-check.
type Options struct {
	*server.Options
	// SelfcheckInterval is how often the loopback client calls the server;
	// 0 disables the self-check. Flag --loopback-selfcheck-interval.
	SelfcheckInterval time.Duration
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{Options: server.NewOptions(), SelfcheckInterval: time.Second}
}

// AddFlags registers every flag on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Options.AddFlags(fs)
	fs.DurationVar(&o.SelfcheckInterval, "loopback-selfcheck-interval", o.SelfcheckInterval, "How often the server calls itself through its loopback client (counted in evercert_loopback_selfcheck_total). 0 disables.")
}

// Run serves until ctx is done. It prints the URL, the CA bundle path and a
// curl line to out once the server listens.
func Run(ctx context.Context, opts *Options, out io.Writer) error {
	serving, err := opts.Build()
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	serving.InstallHandlers(mux)
	mux.Handle("/{$}", statusPage(serving, opts.Clock))

	go func() {
		select {
		case <-ctx.Done():
			return
		case <-serving.Listening():
		}
		printBanner(out, serving.Addr(), opts)
	}()
	return serving.Serve(ctx, mux)
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
