// Command server is evercert's example HTTPS server. With no flags it serves
// an in-memory self-signed certificate that rotates by itself; every flag of
// server.Options works. Its / page shows what each provider serves.
//
// See docs/architecture.md for how the packages fit together.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"
	genericapiserver "k8s.io/apiserver/pkg/server"
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
	ctx := genericapiserver.SetupSignalContext()
	if err := app.Run(ctx, opts, os.Stdout); err != nil {
		klog.ErrorS(err, "Server failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
