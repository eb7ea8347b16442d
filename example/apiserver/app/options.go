package app

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/utils/clock"
	netutils "k8s.io/utils/net"

	"github.com/evercert/evercert/loopback"
)

// Defaults of the example's flags.
const (
	DefaultSecurePort        = 8444
	DefaultSelfcheckInterval = 500 * time.Millisecond
)

// Options are the example server's settings. NewOptions gives the defaults;
// AddFlags binds them to flags.
type Options struct {
	// SecureServing holds --bind-address (default 127.0.0.1), --secure-port
	// (default 8444; 0 picks a free port), --tls-cert-file,
	// --tls-private-key-file and upstream's other serving flags. Without
	// certificate files the server serves a self-signed certificate made and
	// rotated in memory.
	SecureServing *genericoptions.SecureServingOptions
	// LoopbackValidity is the lifetime of each loopback certificate
	// (--loopback-validity, default 24h, at least 1s).
	LoopbackValidity time.Duration
	// SelfcheckInterval is how often the server calls itself through its
	// loopback client (--loopback-selfcheck-interval, default 500ms; 0
	// disables the self-check).
	SelfcheckInterval time.Duration
	// LoopbackClock drives the loopback certificate, its client's validity
	// checks and its health check. Default: the real clock. Tests set a fake
	// clock. The serving certificate always uses the real clock.
	LoopbackClock clock.WithTicker
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	ss := genericoptions.NewSecureServingOptions()
	ss.BindAddress = netutils.ParseIPSloppy("127.0.0.1")
	ss.BindPort = DefaultSecurePort
	return &Options{
		SecureServing:     ss,
		LoopbackValidity:  loopback.DefaultValidity,
		SelfcheckInterval: DefaultSelfcheckInterval,
	}
}

// AddFlags registers the options' flags on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.SecureServing.AddFlags(fs)
	if f := fs.Lookup("secure-port"); f != nil {
		f.Usage = "The port on which to serve HTTPS with authentication and authorization. 0 picks a free port; the log line 'serving on https://HOST:PORT' says which."
	}
	if f := fs.Lookup("tls-cert-file"); f != nil {
		f.Usage = "File containing the default x509 certificate for HTTPS (CA certificates, if any, concatenated after it). Without --tls-cert-file and --tls-private-key-file, a self-signed certificate is made and rotated in memory."
	}
	fs.DurationVar(&o.LoopbackValidity, "loopback-validity", o.LoopbackValidity,
		"Lifetime of the loopback certificate. It is renewed at 2/3 of its life, and its CA rotates too; the loopback client follows both.")
	fs.DurationVar(&o.SelfcheckInterval, "loopback-selfcheck-interval", o.SelfcheckInterval,
		"How often the server calls itself through its loopback client (counted in evercert_loopback_selfcheck_total). 0 disables it.")
}

// Validate checks the options.
func (o *Options) Validate() error {
	errs := o.SecureServing.Validate()
	if o.LoopbackValidity < loopback.MinValidity {
		errs = append(errs, fmt.Errorf("--loopback-validity %v must be at least %v", o.LoopbackValidity, loopback.MinValidity))
	}
	if o.SelfcheckInterval < 0 {
		errs = append(errs, fmt.Errorf("--loopback-selfcheck-interval %v must not be negative", o.SelfcheckInterval))
	}
	return errors.Join(errs...)
}
