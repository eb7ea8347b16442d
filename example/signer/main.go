// Command signer is evercert's example PodCertificateRequest signer: it
// signs the requests kubelets create for pods with a podCertificate volume
// naming --signer-name, by the policy in --policy, with a CA kept in a
// Secret (--ca-secret) and rotated with observation. Replicas run side by
// side. See package app for the flags, example/signer/rbac.yaml for the
// RBAC and example/signer/policy.yaml for a policy.
//
//	signer --kubeconfig ~/.kube/config --ca-secret evercert-signer/evercert-signer-ca \
//	  --policy policy.yaml --self-signed-hosts evercert-signer.evercert-signer.svc --secure-port 0
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

	"github.com/evercert/evercert/example/signer/app"
)

func main() {
	opts := app.NewOptions()
	fs := pflag.NewFlagSet("signer", pflag.ContinueOnError)
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
	signer, err := app.New(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := genericapiserver.SetupSignalContext()
	if err := signer.Run(ctx); err != nil {
		klog.ErrorS(err, "Signer failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
