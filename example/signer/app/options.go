package app

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/validate/content"

	"github.com/evercert/evercert/cabundle"

	"github.com/evercert/evercert/podcert"
	"github.com/evercert/evercert/server"
)

// DefaultSignerName is the signer name served by default.
const DefaultSignerName = "evercert.io/serving"

// Options are the signer's flags: every server.Options flag (of which
// --ca-secret is required) plus the signer's own.
type Options struct {
	*server.Options

	// SignerName is the spec.signerName served. Flag --signer-name,
	// default DefaultSignerName.
	SignerName string
	// PolicyFile is a YAML (or JSON) podcert.Policy. Required. Flag
	// --policy.
	PolicyFile string
	// Workers is how many requests are signed at once. Flag --workers,
	// default 2.
	Workers int
	// KeyTypes are the key types issued to. Flag --key-types, default
	// podcert.DefaultKeyTypes.
	KeyTypes []string
	// MaxLifetime caps every certificate below the request's
	// maxExpirationSeconds. Flag --max-lifetime, default 24h.
	MaxLifetime time.Duration
	// KubeAPIQPS and KubeAPIBurst limit the signer's calls to the API server
	// (client-go's token bucket; each request costs a Pod get, a Services
	// list and a status write). Flags --kube-api-qps, --kube-api-burst,
	// default 50 and 100: client-go's default of 5 would hold a burst of
	// pod starts back by seconds.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// ClusterTrustBundle is the suffix of the ClusterTrustBundle the signer
	// publishes its CA bundle (every unexpired CA) into, named
	// cabundle.ClusterTrustBundleName(SignerName, suffix), e.g.
	// "evercert.io:serving:ca"; a successor CA signs only once that bundle
	// was read back holding it. Empty publishes nothing. Flag
	// --cluster-trust-bundle, default DefaultClusterTrustBundle.
	ClusterTrustBundle string
}

// DefaultClusterTrustBundle is the default suffix of the signer's
// ClusterTrustBundle.
const DefaultClusterTrustBundle = "ca"

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Options:      server.NewOptions(),
		SignerName:   DefaultSignerName,
		Workers:      2,
		KeyTypes:     append([]string(nil), podcert.DefaultKeyTypes...),
		MaxLifetime:  podcert.DefaultMaxLifetimeCap,
		KubeAPIQPS:   50,
		KubeAPIBurst: 100,

		ClusterTrustBundle: DefaultClusterTrustBundle,
	}
}

// AddFlags registers every flag on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Options.AddFlags(fs)
	fs.StringVar(&o.SignerName, "signer-name", o.SignerName, "The spec.signerName of the PodCertificateRequests to sign (pods name it in their podCertificate volume).")
	fs.StringVar(&o.PolicyFile, "policy", o.PolicyFile, "YAML file of the policy: which namespaces and service accounts get certificates, for which DNS names. Required; see example/signer/policy.yaml.")
	fs.IntVar(&o.Workers, "workers", o.Workers, "How many requests are signed at once.")
	fs.StringSliceVar(&o.KeyTypes, "key-types", o.KeyTypes, "Key types issued to; other requests are denied with reason UnsupportedKeyType. Possible values: RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519.")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "Queries per second the signer may send to the API server.")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "Burst of queries the signer may send to the API server above --kube-api-qps.")
	fs.StringVar(&o.ClusterTrustBundle, "cluster-trust-bundle", o.ClusterTrustBundle,
		"Suffix of the ClusterTrustBundle <signer name with / as :>:<suffix> the CA bundle is published into, for pods (clusterTrustBundle volumes) and webhooks (example/webhook --ca-from-signer) to trust. Empty publishes none.")
	fs.DurationVar(&o.MaxLifetime, "max-lifetime", o.MaxLifetime, "Longest certificate lifetime, whatever a request's maxExpirationSeconds allows (1h to 2184h).")
}

// Validate checks every option and returns one error per bad value, each
// naming its flag. The policy file is read and checked here.
func (o *Options) Validate() []error {
	errs := o.Options.Validate()
	if o.CASecret == "" {
		errs = append(errs, errors.New("--ca-secret: required: the signer keeps its CA in this Secret, shared by every replica"))
	}
	if err := podcert.ValidateSignerName(o.SignerName); err != nil {
		errs = append(errs, fmt.Errorf("--signer-name: %w", err))
	}
	if _, err := o.policy(); err != nil {
		errs = append(errs, err)
	}
	if o.Workers < 1 {
		errs = append(errs, fmt.Errorf("--workers: %d must be at least 1", o.Workers))
	}
	if o.KubeAPIQPS <= 0 || o.KubeAPIBurst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-qps, --kube-api-burst: %v and %d must be positive", o.KubeAPIQPS, o.KubeAPIBurst))
	}
	if len(o.KeyTypes) == 0 {
		errs = append(errs, errors.New("--key-types: empty: every request would be denied"))
	}
	for _, kt := range o.KeyTypes {
		if !slices.Contains(podcert.AllKeyTypes, kt) {
			errs = append(errs, fmt.Errorf("--key-types: unknown key type %q (want some of %v)", kt, podcert.AllKeyTypes))
		}
	}
	if o.ClusterTrustBundle != "" {
		name := cabundle.ClusterTrustBundleName(o.SignerName, o.ClusterTrustBundle)
		if msgs := content.IsPathSegmentName(name); len(msgs) > 0 || strings.Contains(o.ClusterTrustBundle, ":") {
			errs = append(errs, fmt.Errorf("--cluster-trust-bundle: %q makes the invalid name %q", o.ClusterTrustBundle, name))
		}
	}
	if o.MaxLifetime < podcert.MinLifetime || o.MaxLifetime > podcert.MaxLifetime {
		errs = append(errs, fmt.Errorf("--max-lifetime: %v is outside %v to %v, the lifetimes the API accepts", o.MaxLifetime, podcert.MinLifetime, podcert.MaxLifetime))
	}
	return errs
}

// policy reads and validates --policy.
func (o *Options) policy() (podcert.Policy, error) {
	if o.PolicyFile == "" {
		return podcert.Policy{}, errors.New("--policy: required: a signer must say who gets which names")
	}
	data, err := os.ReadFile(o.PolicyFile)
	if err != nil {
		return podcert.Policy{}, fmt.Errorf("--policy: %w", err)
	}
	p, err := podcert.ParsePolicy(data)
	if err != nil {
		return podcert.Policy{}, fmt.Errorf("--policy %s: %w", o.PolicyFile, err)
	}
	return p, nil
}
