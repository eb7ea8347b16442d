// Command apiserver is a genericapiserver without etcd whose serving and
// loopback certificates rotate in memory, and whose loopback client follows
// the rotation. It serves the read-only API certificates.evercert.io/v1alpha1
// (servingcertificates: what it serves right now). Standalone:
//
//	go run ./example/apiserver --secure-port=0 --loopback-validity=10s
//
// Aggregated into a kube-apiserver, with delegated authentication and
// authorization and a self-registered APIService whose caBundle follows the
// serving CA:
//
//	go run ./example/apiserver --kubeconfig=$KUBECONFIG \
//	    --apiservice-service=evercert/evercert-example-apiserver --self-signed-validity=1h
//
// See package app for the wiring.
//
// See docs/architecture.md for how the packages fit together.
package main

import (
	"flag"
	"os"

	"github.com/spf13/pflag"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/example/apiserver/app"
)

func main() {
	opts := app.NewOptions()
	fs := pflag.NewFlagSet(os.Args[0], pflag.ExitOnError)
	opts.AddFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	_ = fs.Parse(os.Args[1:])

	ctx := genericapiserver.SetupSignalContext()
	if err := app.Run(ctx, opts); err != nil {
		klog.ErrorS(err, "Server failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}
