package app

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/utils/clock"
	netutils "k8s.io/utils/net"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/loopback"
)

// Defaults of the example's flags.
const (
	DefaultSecurePort        = 8444
	DefaultSelfcheckInterval = 500 * time.Millisecond
	// DefaultAPIServicePort is the default of --apiservice-port.
	DefaultAPIServicePort = 443
	// MinSelfSignedValidity is the shortest --self-signed-validity accepted.
	MinSelfSignedValidity = time.Second
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
	// SelfSignedHosts are the DNS names and IP addresses of the in-memory
	// self-signed serving certificate (--self-signed-hosts, default
	// localhost,127.0.0.1,::1). A non-loopback --bind-address and, when the
	// server registers an APIService, the Service's DNS name
	// <name>.<namespace>.svc (the name the aggregator verifies) are added.
	SelfSignedHosts []string
	// SelfSignedValidity is the lifetime of each self-signed serving leaf
	// (--self-signed-validity, default 30 days, at least 1s). Its CA lives
	// three times as long and is rotated too.
	SelfSignedValidity time.Duration
	// SelfSignedRenewBefore is how long before expiry the serving leaf is
	// replaced (--self-signed-renew-before; 0 means a third of the
	// validity).
	SelfSignedRenewBefore time.Duration
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

	// Kubeconfig is the kubeconfig file of the kube-apiserver this server
	// is aggregated into (--kubeconfig). When set, authentication and
	// authorization are delegated to that kube-apiserver (TokenReview,
	// SubjectAccessReview, request-header and client CAs from the
	// kube-system/extension-apiserver-authentication ConfigMap unless given
	// by flag), and, with APIServiceService, the server registers its
	// APIService. When empty the server stands alone: anonymous access to
	// PublicPaths, everything for system:masters (the loopback client).
	Kubeconfig string
	// Authentication holds the delegated authentication flags
	// (--authentication-kubeconfig, default --kubeconfig;
	// --requestheader-client-ca-file and the other --requestheader-* flags;
	// --client-ca-file; ...). Used only with Kubeconfig.
	Authentication *genericoptions.DelegatingAuthenticationOptions
	// Authorization holds the delegated authorization flags
	// (--authorization-kubeconfig, default --kubeconfig; cache TTLs;
	// --authorization-always-allow-paths). Used only with Kubeconfig.
	Authorization *genericoptions.DelegatingAuthorizationOptions
	// APIServiceService is the Service, as namespace/name, that the
	// APIService v1alpha1.certificates.evercert.io points at
	// (--apiservice-service). With Kubeconfig, a non-empty value makes the
	// server create or update that APIService and keep its caBundle equal to
	// the serving CA bundle. The Service and its endpoints are the
	// deployer's job.
	APIServiceService string
	// APIServicePort is the Service port the APIService refers to
	// (--apiservice-port, default 443).
	APIServicePort int32
	// APIServiceCAFile is a PEM CA bundle to publish as the APIService's
	// caBundle when the serving certificate comes from --tls-cert-file
	// (--apiservice-ca-file). Without certificate files the in-memory
	// serving CA bundle is published and this must be empty.
	APIServiceCAFile string
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	ss := genericoptions.NewSecureServingOptions()
	ss.BindAddress = netutils.ParseIPSloppy("127.0.0.1")
	ss.BindPort = DefaultSecurePort
	return &Options{
		SecureServing:      ss,
		SelfSignedHosts:    append([]string(nil), authority.DefaultSelfSignedHosts...),
		SelfSignedValidity: authority.DefaultSelfSignedLifetime,
		LoopbackValidity:   loopback.DefaultValidity,
		SelfcheckInterval:  DefaultSelfcheckInterval,
		Authentication:     genericoptions.NewDelegatingAuthenticationOptions(),
		Authorization:      genericoptions.NewDelegatingAuthorizationOptions(),
		APIServicePort:     DefaultAPIServicePort,
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
	fs.StringSliceVar(&o.SelfSignedHosts, "self-signed-hosts", o.SelfSignedHosts,
		"DNS names and IP addresses of the in-memory self-signed serving certificate. A non-loopback --bind-address and, with --apiservice-service, <name>.<namespace>.svc are added.")
	fs.DurationVar(&o.SelfSignedValidity, "self-signed-validity", o.SelfSignedValidity,
		"Lifetime of the in-memory self-signed serving certificate. Its CA lives three times as long; both rotate in memory, and a new CA joins the CA bundle before it signs.")
	fs.DurationVar(&o.SelfSignedRenewBefore, "self-signed-renew-before", o.SelfSignedRenewBefore,
		"How long before expiry the self-signed serving certificate is replaced. 0 means a third of --self-signed-validity.")
	fs.DurationVar(&o.LoopbackValidity, "loopback-validity", o.LoopbackValidity,
		"Lifetime of the loopback certificate. It is renewed at 2/3 of its life, and its CA rotates too; the loopback client follows both.")
	fs.DurationVar(&o.SelfcheckInterval, "loopback-selfcheck-interval", o.SelfcheckInterval,
		"How often the server calls itself through its loopback client (counted in evercert_loopback_selfcheck_total). 0 disables it.")

	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig,
		"kubeconfig file of the kube-apiserver this server is aggregated into. When set, authentication and authorization are delegated to it (TokenReview, SubjectAccessReview, request-header CA from kube-system/extension-apiserver-authentication), and with --apiservice-service the APIService is registered. When empty the server runs standalone.")
	o.Authentication.AddFlags(fs)
	if f := fs.Lookup("authentication-kubeconfig"); f != nil {
		f.Usage = "kubeconfig file for delegated authentication (tokenreviews.authentication.k8s.io and the extension-apiserver-authentication ConfigMap). Default --kubeconfig."
	}
	o.Authorization.AddFlags(fs)
	if f := fs.Lookup("authorization-kubeconfig"); f != nil {
		f.Usage = "kubeconfig file for delegated authorization (subjectaccessreviews.authorization.k8s.io). Default --kubeconfig."
	}
	fs.StringVar(&o.APIServiceService, "apiservice-service", o.APIServiceService,
		"Service (namespace/name) of the APIService v1alpha1.certificates.evercert.io. With --kubeconfig, the server creates or updates that APIService and keeps its caBundle equal to the serving CA bundle. Empty: no registration.")
	fs.Int32Var(&o.APIServicePort, "apiservice-port", o.APIServicePort,
		"Service port the APIService refers to.")
	fs.StringVar(&o.APIServiceCAFile, "apiservice-ca-file", o.APIServiceCAFile,
		"PEM CA bundle published as the APIService caBundle when --tls-cert-file is used (reloaded on change). Without certificate files the in-memory serving CA bundle is published.")
}

// Delegated reports whether authentication and authorization are delegated
// to a kube-apiserver (Kubeconfig is set).
func (o *Options) Delegated() bool { return o.Kubeconfig != "" }

// Registers reports whether the server registers its APIService.
func (o *Options) Registers() bool { return o.Delegated() && o.APIServiceService != "" }

// servedByFiles reports whether the serving certificate comes from files.
func (o *Options) servedByFiles() bool {
	cert := o.SecureServing.ServerCert.CertKey
	return cert.CertFile != "" || cert.KeyFile != "" || o.SecureServing.ServerCert.GeneratedCert != nil
}

// APIServiceServiceRef splits APIServiceService into namespace and name.
func (o *Options) APIServiceServiceRef() (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(o.APIServiceService, "/")
	if !ok || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("--apiservice-service %q must be namespace/name", o.APIServiceService)
	}
	var errs []error
	for _, msg := range validation.IsDNS1123Label(namespace) {
		errs = append(errs, fmt.Errorf("--apiservice-service namespace %q: %s", namespace, msg))
	}
	for _, msg := range validation.IsDNS1035Label(name) {
		errs = append(errs, fmt.Errorf("--apiservice-service name %q: %s", name, msg))
	}
	if len(errs) > 0 {
		return "", "", errors.Join(errs...)
	}
	return namespace, name, nil
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
	if err := dynamiccert.ValidateHosts("--self-signed-hosts", o.SelfSignedHosts); err != nil {
		errs = append(errs, err)
	}
	if o.SelfSignedValidity < MinSelfSignedValidity {
		errs = append(errs, fmt.Errorf("--self-signed-validity %v must be at least %v", o.SelfSignedValidity, MinSelfSignedValidity))
	}
	if o.SelfSignedRenewBefore < 0 || (o.SelfSignedRenewBefore > 0 && o.SelfSignedRenewBefore >= o.SelfSignedValidity) {
		errs = append(errs, fmt.Errorf("--self-signed-renew-before %v must be 0 or positive and shorter than --self-signed-validity %v", o.SelfSignedRenewBefore, o.SelfSignedValidity))
	}

	if !o.Delegated() {
		for _, f := range []struct {
			flag string
			set  bool
		}{
			{"--authentication-kubeconfig", o.Authentication.RemoteKubeConfigFile != ""},
			{"--authorization-kubeconfig", o.Authorization.RemoteKubeConfigFile != ""},
			{"--requestheader-client-ca-file", o.Authentication.RequestHeader.ClientCAFile != ""},
			{"--client-ca-file", o.Authentication.ClientCert.ClientCA != ""},
			{"--apiservice-service", o.APIServiceService != ""},
			{"--apiservice-ca-file", o.APIServiceCAFile != ""},
		} {
			if f.set {
				errs = append(errs, fmt.Errorf("%s needs --kubeconfig (a standalone server neither delegates authentication nor registers an APIService)", f.flag))
			}
		}
		return errors.Join(errs...)
	}
	errs = append(errs, o.Authentication.Validate()...)
	errs = append(errs, o.Authorization.Validate()...)
	if o.APIServiceService != "" {
		if _, _, err := o.APIServiceServiceRef(); err != nil {
			errs = append(errs, err)
		}
		if o.APIServicePort < 1 || o.APIServicePort > 65535 {
			errs = append(errs, fmt.Errorf("--apiservice-port %d must be between 1 and 65535", o.APIServicePort))
		}
		switch {
		case o.servedByFiles() && o.APIServiceCAFile == "":
			errs = append(errs, errors.New("--apiservice-ca-file is required to register the APIService when the serving certificate comes from --tls-cert-file"))
		case !o.servedByFiles() && o.APIServiceCAFile != "":
			errs = append(errs, errors.New("--apiservice-ca-file is only used with --tls-cert-file; the in-memory serving CA bundle is published otherwise"))
		}
	} else if o.APIServiceCAFile != "" {
		errs = append(errs, errors.New("--apiservice-ca-file needs --apiservice-service"))
	}
	return errors.Join(errs...)
}
