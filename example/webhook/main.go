// Command webhook is evercert's example admission webhook: ConfigMaps in
// namespaces labelled evercert.io/webhook=enabled must carry the label "app"
// and get the annotation evercert.io/defaulted=true. Its serving certificate
// is signed by a CA kept in a Secret (--ca-secret) and rotates in memory;
// the CA bundle is published into the webhook configurations. See package
// app for the flags and example/webhook/rbac.yaml for the RBAC.
//
//	webhook --kubeconfig ~/.kube/config --ca-secret default/evercert-example-webhook-ca \
//	  --self-signed-hosts 127.0.0.1 --secure-port 0 --register-url https://127.0.0.1
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

	"github.com/evercert/evercert/example/webhook/app"
)

func main() {
	opts := app.NewOptions()
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
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
	webhook, err := app.New(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := genericapiserver.SetupSignalContext()
	if err := webhook.Run(ctx); err != nil {
		klog.ErrorS(err, "Webhook failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
