// Command apiserver is a standalone genericapiserver (no etcd, no
// kubeconfig) whose loopback certificate rotates in memory and whose
// loopback client follows the rotation. See package app for the wiring.
//
//	go run ./example/apiserver --secure-port=0 --loopback-validity=10s
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
