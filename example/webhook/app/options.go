package app

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/podcert"
	"github.com/evercert/evercert/server"
)

// DefaultConfigurationName is the default name of both webhook
// configurations (a ValidatingWebhookConfiguration and a
// MutatingWebhookConfiguration may share a name, being different kinds).
const DefaultConfigurationName = "evercert-example-webhook"

// Options are the webhook's flags: every server.Options flag (of which
// --ca-secret is required) plus where the trust bundle is published.
type Options struct {
	*server.Options

	// ValidatingWebhookConfiguration names the ValidatingWebhookConfiguration
	// whose caBundle is kept current; empty serves no validating
	// configuration. Flag --validating-webhook-configuration.
	ValidatingWebhookConfiguration string
	// MutatingWebhookConfiguration names the MutatingWebhookConfiguration
	// whose caBundle is kept current; empty serves no mutating configuration.
	// Flag --mutating-webhook-configuration.
	MutatingWebhookConfiguration string
	// WebhookService ("namespace/name"), when set, restricts publishing to
	// the webhooks whose clientConfig.service is this Service. Flag
	// --webhook-service.
	WebhookService string
	// RegisterURL, when set, makes the webhook create or update the
	// configurations itself, pointing their clientConfig.url at this
	// https URL (plus /validate or /mutate). Without a port, the port the
	// server listens on is used. Flag --register-url.
	RegisterURL string
	// CAFromSigner, when set, takes the caBundle from the ClusterTrustBundles
	// of this signer (cabundle.ClusterTrustBundleSource) instead of from
	// --ca-secret, with which it is mutually exclusive: the webhook then
	// serves a certificate that signer issued, the kubelet's credential
	// bundle of a podCertificate volume given as both --tls-cert-file and
	// --tls-private-key-file. The published caBundle is verified against
	// that served certificate. Flag --ca-from-signer.
	CAFromSigner string
	// TargetNamespace, when set, enforces the rule in this one namespace
	// instead of in the namespaces labelled evercert.io/webhook=enabled.
	// Flag --target-namespace.
	TargetNamespace string
}

// NewOptions returns the defaults: the server defaults, and both
// configurations named DefaultConfigurationName.
func NewOptions() *Options {
	o := &Options{
		Options:                        server.NewOptions(),
		ValidatingWebhookConfiguration: DefaultConfigurationName,
		MutatingWebhookConfiguration:   DefaultConfigurationName,
	}
	// The publisher (and, with --ca-from-signer, the ClusterTrustBundle
	// source) are clients of --kubeconfig whatever the certificate flags.
	o.Options.KubeconfigUsedElsewhere = true
	return o
}

// AddFlags registers every flag on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Options.AddFlags(fs)
	fs.StringVar(&o.ValidatingWebhookConfiguration, "validating-webhook-configuration", o.ValidatingWebhookConfiguration,
		"Name of the ValidatingWebhookConfiguration whose caBundle is kept equal to the CA bundle of --ca-secret. Empty disables it.")
	fs.StringVar(&o.MutatingWebhookConfiguration, "mutating-webhook-configuration", o.MutatingWebhookConfiguration,
		"Name of the MutatingWebhookConfiguration whose caBundle is kept equal to the CA bundle of --ca-secret. Empty disables it.")
	fs.StringVar(&o.WebhookService, "webhook-service", o.WebhookService,
		"namespace/name of the webhook's Service. If set, only the webhooks whose clientConfig.service is this Service get the caBundle.")
	fs.StringVar(&o.RegisterURL, "register-url", o.RegisterURL,
		"If set (https://HOST[:PORT]), create or update the webhook configurations with clientConfig.url pointing here (/validate, /mutate). "+
			"Without a port, the port the server listens on is used. For local demos and tests; RBAC additionally needs get, create and update on the configurations.")
	fs.StringVar(&o.CAFromSigner, "ca-from-signer", o.CAFromSigner,
		"Signer name (e.g. evercert.io/serving) whose ClusterTrustBundles are the caBundle to publish, instead of --ca-secret's CA; "+
			"serve the signer's certificate with --tls-cert-file and --tls-private-key-file (a pod's podCertificate credential bundle, both flags naming that file).")
	fs.StringVar(&o.TargetNamespace, "target-namespace", o.TargetNamespace,
		"If set, the rule applies to this namespace only, instead of to the namespaces labelled "+EnabledNamespaceLabel+"="+EnabledNamespaceValue+".")
}

// Validate checks every option and returns one error per bad value, each
// naming its flag.
func (o *Options) Validate() []error {
	errs := o.Options.Validate()
	switch {
	case o.CAFromSigner != "" && o.CASecret != "":
		errs = append(errs, errors.New("--ca-from-signer, --ca-secret: mutually exclusive: the caBundle comes from one of them"))
	case o.CAFromSigner != "":
		if err := podcert.ValidateSignerName(o.CAFromSigner); err != nil {
			errs = append(errs, fmt.Errorf("--ca-from-signer: %w", err))
		}
		if o.CertFile == "" {
			errs = append(errs, errors.New("--ca-from-signer: requires --tls-cert-file and --tls-private-key-file: the certificate the signer issued"))
		}
	case o.CASecret == "":
		errs = append(errs, errors.New("--ca-secret: required (or --ca-from-signer): the webhook keeps its CA in this Secret and publishes its bundle into the webhook configurations"))
	}
	if o.ValidatingWebhookConfiguration == "" && o.MutatingWebhookConfiguration == "" {
		errs = append(errs, errors.New("--validating-webhook-configuration, --mutating-webhook-configuration: at least one must be set"))
	}
	for flag, name := range map[string]string{
		"--validating-webhook-configuration": o.ValidatingWebhookConfiguration,
		"--mutating-webhook-configuration":   o.MutatingWebhookConfiguration,
	} {
		if name == "" {
			continue
		}
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: %q: %s", flag, name, strings.Join(msgs, "; ")))
		}
	}
	if o.WebhookService != "" {
		if _, err := o.serviceRef(); err != nil {
			errs = append(errs, fmt.Errorf("--webhook-service: %w", err))
		}
		if o.RegisterURL != "" {
			errs = append(errs, errors.New("--webhook-service, --register-url: mutually exclusive (registered webhooks use clientConfig.url, not a service)"))
		}
	}
	if o.RegisterURL != "" {
		if _, err := parseRegisterURL(o.RegisterURL); err != nil {
			errs = append(errs, fmt.Errorf("--register-url: %w", err))
		}
	}
	if o.TargetNamespace != "" {
		if msgs := validation.IsDNS1123Label(o.TargetNamespace); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--target-namespace: %q: %s", o.TargetNamespace, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// serviceRef parses WebhookService; nil when it is empty.
func (o *Options) serviceRef() (*cabundle.ServiceRef, error) {
	if o.WebhookService == "" {
		return nil, nil
	}
	ns, name, ok := strings.Cut(o.WebhookService, "/")
	if !ok || strings.Contains(name, "/") {
		return nil, fmt.Errorf("%q must be namespace/name", o.WebhookService)
	}
	if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		return nil, fmt.Errorf("namespace %q: %s", ns, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1035Label(name); len(msgs) > 0 {
		return nil, fmt.Errorf("service name %q: %s", name, strings.Join(msgs, "; "))
	}
	return &cabundle.ServiceRef{Namespace: ns, Name: name}, nil
}

// parseRegisterURL checks that raw is https://HOST[:PORT] with nothing
// else, since the paths are appended to it.
func parseRegisterURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	switch {
	case u.Scheme != "https":
		return nil, fmt.Errorf("%q: the scheme must be https", raw)
	case u.Hostname() == "":
		return nil, fmt.Errorf("%q: a host is required", raw)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/"):
		return nil, fmt.Errorf("%q: only https://HOST[:PORT] is allowed (no user, path, query or fragment)", raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%q: invalid port %q", raw, p)
		}
	}
	u.Path = ""
	return u, nil
}

// registerBase returns the base URL the configurations point at: RegisterURL,
// with the listening port filled in when it has none.
func (o *Options) registerBase(listening net.Addr) (string, error) {
	u, err := parseRegisterURL(o.RegisterURL)
	if err != nil {
		return "", err
	}
	if u.Port() == "" {
		_, port, err := net.SplitHostPort(listening.String())
		if err != nil {
			return "", fmt.Errorf("listening address %s: %w", listening, err)
		}
		u.Host = net.JoinHostPort(u.Hostname(), port)
	}
	return u.String(), nil
}
