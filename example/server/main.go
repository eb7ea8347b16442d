// Command server is evercert's example HTTPS server. With no flags it serves
// an in-memory self-signed certificate that rotates by itself; every flag of
// server.Options works. Its / page shows what each provider serves.
//
// See docs/architecture.md for how the packages fit together.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/example/server/app"
)

func main() {
	opts := app.NewOptions()
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	opts.AddFlags(fs)
	logOpts := logs.NewOptions()
	logsapi.AddFlags(logOpts, fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			return
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := logsapi.ValidateAndApply(logOpts, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := shutdownOnSignal()
	defer stop()
	if err := app.Run(ctx, opts, os.Stdout); err != nil {
		klog.ErrorS(err, "Server failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// shutdownOnSignal returns a context that ends on the first SIGTERM or
// SIGINT, which starts the graceful shutdown (bounded by
// --shutdown-timeout). A second signal exits at once with status 1, as
// Kubernetes servers do: an operator who presses Ctrl-C twice does not
// wait out a long timeout.
func shutdownOnSignal() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	done := make(chan struct{})
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-sigs:
		case <-done:
			return
		}
		cancel()
		select {
		case s := <-sigs:
			klog.InfoS("Second signal: exiting without waiting for the graceful shutdown", "signal", s.String())
			klog.Flush()
			os.Exit(1)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}
