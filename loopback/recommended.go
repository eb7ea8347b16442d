package loopback

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/options"

	"github.com/evercert/evercert/authority"
)

// DefaultServingName is the provider name of the self-signed serving
// certificate ApplyRecommendedOptions makes when none is given.
const DefaultServingName = "serving"

// ApplyConfig configures ApplyRecommendedOptions. The zero value is usable:
// a loopback certificate with the defaults of CertificateConfig and, unless
// certificate files are given, a self-signed serving certificate made and
// rotated in memory.
type ApplyConfig struct {
	// Loopback configures the loopback certificate (see CertificateConfig).
	Loopback CertificateConfig
	// Serving is the default serving certificate, the one served to clients
	// whose SNI matches no SNI certificate: any CertKeyContentProvider, e.g.
	// a authority.SelfSigned, Authority, FileCertKey or SecretCertKey.
	// genericapiserver runs it while it serves (when it is a
	// ControllerRunner) and serves every change it announces. It cannot be
	// combined with --tls-cert-file/--tls-private-key-file or
	// ServerCert.GeneratedCert; that is an error.
	//
	// Default nil: the certificate files when given (upstream's provider,
	// which reloads them on change), else ServerCert.GeneratedCert when set,
	// else a authority.SelfSigned named DefaultServingName for
	// authority.DefaultSelfSignedHosts plus the bind address when it is
	// neither loopback nor unspecified plus AlternateDNS and AlternateIPs,
	// with authority's default lifetimes and Loopback.Clock. It replaces
	// upstream's never-rotated certificate from
	// MaybeDefaultWithSelfSignedCerts; do not call that (its certificate
	// would be used instead), pass its alternate names in AlternateDNS and
	// AlternateIPs.
	Serving dynamiccertificates.CertKeyContentProvider
	// AlternateDNS and AlternateIPs are added to the names of the
	// self-signed default: what sample-apiserver passes to
	// MaybeDefaultWithSelfSignedCerts as alternateDNS and alternateIPs, e.g.
	// the Service name "<service>.<namespace>.svc" the aggregator verifies.
	// Default none. They name only the self-signed default, so giving them
	// with Serving, certificate files or GeneratedCert is an error, not
	// silently unused.
	AlternateDNS []string
	AlternateIPs []net.IP
}

// Applied is what ApplyRecommendedOptions installed. Both fields are nil
// when secure serving is off.
type Applied struct {
	// Loopback is the rotating loopback certificate: the first SNI
	// certificate, the source of cfg.LoopbackClientConfig, the
	// "loopback-serving-certificate" check and the PostStartHookName hook.
	Loopback *Certificate
	// Serving is the default serving certificate (cfg.SecureServing.Cert):
	// ApplyConfig.Serving, the provider of the certificate files or
	// GeneratedCert, or the self-signed default, a *authority.SelfSigned
	// whose CA bundle clients (and an APIService's caBundle) trust.
	//
	// The self-signed default's CA exists only in memory and rotates: there
	// is no apiserver.crt to copy into an APIService's caBundle. Publish it
	// instead with a cabundle.Publisher whose Source is Serving (a
	// dynamiccertificates.CAContentProvider) and whose target is the
	// APIService, and make the publisher an observer of the CA rotation, so
	// that a successor CA signs only once the APIService holds it:
	//
	//	ca := applied.Serving.(*authority.SelfSigned)
	//	publisher, err := cabundle.NewPublisher(cabundle.PublisherConfig{
	//		Source: ca, KubeConfig: cfg.ClientConfig, // or AggregatorClient
	//		Targets: []cabundle.Target{{Kind: cabundle.APIService, Name: "v1alpha1.wardle.example.com"}},
	//	})
	//	ca.AddObserver(publisher)
	//	cfg.AddReadyzChecks(publisher.HealthCheck())
	//	// in a post-start hook: go publisher.Run(hookCtx, 0)
	//
	// test/sampleapiserver (Options.APIService) is wired this way.
	Serving dynamiccertificates.CertKeyContentProvider
}

// ApplyRecommendedOptions replaces o.ApplyTo(cfg), upstream's
// RecommendedOptions.ApplyTo, for a server whose loopback and serving
// certificates rotate. It applies, in this order:
//
//  1. the plain SecureServingOptions of o.SecureServing (listener, TLS
//     settings, --tls-sni-cert-key), never its loopback part;
//  2. the default serving certificate (ApplyConfig.Serving);
//  3. ApplyToConfig: evercert's loopback certificate first in SNICerts,
//     cfg.LoopbackClientConfig, the "loopback-serving-certificate" check on
//     /healthz and /livez, and the rotation post-start hook;
//  4. a "ca-rotation:<name>" check on /healthz and /readyz when the serving
//     certificate reports its CA rotation (authority.RotationReporter:
//     SelfSigned, Authority; see authority.RotationCheck);
//  5. everything else in o, through upstream's RecommendedOptions.ApplyTo on
//     a copy of o without SecureServing: Etcd, EgressSelector, Traces,
//     Authentication, Authorization, Audit, CoreAPI, Features,
//     ExtraAdmissionInitializers and Admission.
//
// So whatever RecommendedOptions.ApplyTo builds from cfg.LoopbackClientConfig
// — the clients and informers made in ExtraAdmissionInitializers (where
// sample-apiserver builds its admission informers), Traces' wrapper — uses
// evercert's config, whose trust follows every rotation, and no upstream
// loopback certificate, client config or health check is ever made. The only
// difference from upstream's order is that secure serving comes before Etcd,
// EgressSelector and Traces, which do not read it (Traces then wraps the
// loopback config with its tracer, which upstream skips because the config
// does not exist yet at that point).
//
// A wrong order is an error wrapping ErrWrongOrder, and then nothing is
// applied: cfg must not have been through RecommendedOptions.ApplyTo or any
// loopback (cfg.SecureServing or cfg.LoopbackClientConfig set, a
// "loopback-serving-certificate" check or the PostStartHookName hook
// present).
//
// Applying something to cfg afterwards is caught too, in two ways:
//
//   - o.ApplyTo(cfg), upstream's RecommendedOptions.ApplyTo, called on the
//     same o and cfg after ApplyRecommendedOptions (the likeliest mistake:
//     the new call added, the old one left in place) returns an error
//     wrapping ErrWrongOrder. For this ApplyRecommendedOptions replaces
//     o.ExtraAdmissionInitializers with a wrapper that calls the original
//     for any other config and refuses cfg; upstream calls it after its
//     own secure serving and before its admission, which would otherwise
//     fail with a "start-apiserver-admission-initializer ... already
//     registered" error that does not name the cause. cfg is then partly
//     applied twice: discard it.
//   - A bare SecureServingOptionsWithLoopback.ApplyTo or ApplyToConfig
//     afterwards replaces cfg.LoopbackClientConfig; the rotation post-start
//     hook then fails at start with ErrWrongOrder (see PostStartHook).
//
// With o.SecureServing nil or secure serving off (no Listener and BindPort
// 0), steps 1 to 4 do nothing, as upstream, and both fields of Applied are
// nil; an ApplyConfig.Serving is then an error, not silently unused.
//
// o itself is not modified apart from o.ExtraAdmissionInitializers (see
// above); o.SecureServing gets its Listener, BindAddress and BindPort filled
// in by SecureServingOptions.ApplyTo, as upstream. On an
// error from step 5, cfg is partly applied, as with upstream: discard it.
// ApplyRecommendedOptions is not safe for concurrent use with other changes
// to o or cfg.
func ApplyRecommendedOptions(o *options.RecommendedOptions, cfg *server.RecommendedConfig, opts ApplyConfig) (*Applied, error) {
	if o == nil || cfg == nil {
		return nil, errors.New("loopback.ApplyRecommendedOptions: options and config must not be nil")
	}
	if err := checkFreshConfig(&cfg.Config); err != nil {
		return nil, err
	}
	var ss *options.SecureServingOptions
	if o.SecureServing != nil {
		ss = o.SecureServing.SecureServingOptions
	}
	if opts.Serving != nil {
		if err := checkServingConflict(ss, "a serving certificate provider was given"); err != nil {
			return nil, err
		}
		if len(opts.AlternateDNS) > 0 || len(opts.AlternateIPs) > 0 {
			return nil, fmt.Errorf("loopback.ApplyRecommendedOptions: ApplyConfig.AlternateDNS %v and AlternateIPs %v name the self-signed default, "+
				"but a serving certificate provider (%q) was given: put the names into that provider", opts.AlternateDNS, opts.AlternateIPs, opts.Serving.Name())
		}
	} else if len(opts.AlternateDNS) > 0 || len(opts.AlternateIPs) > 0 {
		if err := checkServingConflict(ss, fmt.Sprintf("ApplyConfig.AlternateDNS %v and AlternateIPs %v name the self-signed default", opts.AlternateDNS, opts.AlternateIPs)); err != nil {
			return nil, err
		}
	}
	if err := ss.ApplyTo(&cfg.SecureServing); err != nil {
		return nil, fmt.Errorf("secure serving: %w", err)
	}

	applied := &Applied{}
	if info := cfg.SecureServing; info != nil {
		if err := applyServing(info, ss, opts); err != nil {
			return nil, err
		}
		cert, err := ApplyToConfig(&cfg.Config, opts.Loopback)
		if err != nil {
			return nil, fmt.Errorf("loopback certificate: %w", err)
		}
		applied.Loopback, applied.Serving = cert, info.Cert
		if r, ok := info.Cert.(authority.RotationReporter); ok {
			// A stalled CA rotation waits for an observer; a restart does not
			// help, so it is no liveness check.
			check := authority.RotationCheck(r)
			cfg.AddHealthzChecks(check)
			cfg.AddReadyzChecks(check)
		}
	} else if opts.Serving != nil {
		return nil, fmt.Errorf("loopback.ApplyRecommendedOptions: a serving certificate (provider %q) was given but secure serving is off (no listener and --secure-port 0)", opts.Serving.Name())
	}

	rest := *o
	rest.SecureServing = nil // applied above, without upstream's loopback
	if err := rest.ApplyTo(cfg); err != nil {
		return nil, err
	}
	o.ExtraAdmissionInitializers = refuseAgain(o.ExtraAdmissionInitializers, cfg)
	return applied, nil
}

// refuseAgain wraps extra, a RecommendedOptions.ExtraAdmissionInitializers,
// so that it refuses applied, a config ApplyRecommendedOptions applied:
// upstream's RecommendedOptions.ApplyTo calls it on every apply, after its
// secure serving and before its admission, so RecommendedOptions.ApplyTo
// left in place after ApplyRecommendedOptions returns ErrWrongOrder instead
// of upstream's "already registered" error about an admission hook. Any
// other config gets extra's answer (none when extra is nil).
func refuseAgain(extra func(*server.RecommendedConfig) ([]admission.PluginInitializer, error), applied *server.RecommendedConfig) func(*server.RecommendedConfig) ([]admission.PluginInitializer, error) {
	return func(c *server.RecommendedConfig) ([]admission.PluginInitializer, error) {
		if c == applied {
			return nil, fmt.Errorf("%w: RecommendedOptions.ApplyTo ran on a config that loopback.ApplyRecommendedOptions already applied; "+
				"it would add upstream's loopback and every other option a second time. "+
				"loopback.ApplyRecommendedOptions replaces RecommendedOptions.ApplyTo: remove the RecommendedOptions.ApplyTo call", ErrWrongOrder)
		}
		if extra == nil {
			return nil, nil
		}
		return extra(c)
	}
}

// checkFreshConfig returns an error wrapping ErrWrongOrder if secure serving
// or a loopback was already applied to cfg.
func checkFreshConfig(cfg *server.Config) error {
	if cfg.SecureServing != nil || cfg.LoopbackClientConfig != nil {
		return fmt.Errorf("%w: the config already has secure serving or a loopback client config, so RecommendedOptions.ApplyTo or "+
			"SecureServingOptions(WithLoopback).ApplyTo ran on it before; call loopback.ApplyRecommendedOptions instead of RecommendedOptions.ApplyTo, on a new config",
			ErrWrongOrder)
	}
	return checkNoLoopback(cfg)
}

// checkServingConflict returns an error if ss already names a serving
// certificate, which what (ApplyConfig.Serving, or the alternate names of
// the self-signed default) would silently override or miss.
func checkServingConflict(ss *options.SecureServingOptions, what string) error {
	if ss == nil {
		return nil
	}
	var given []string
	if ss.ServerCert.CertKey.CertFile != "" {
		given = append(given, "--tls-cert-file "+ss.ServerCert.CertKey.CertFile)
	}
	if ss.ServerCert.CertKey.KeyFile != "" {
		given = append(given, "--tls-private-key-file "+ss.ServerCert.CertKey.KeyFile)
	}
	if ss.ServerCert.GeneratedCert != nil {
		given = append(given, fmt.Sprintf("ServerCert.GeneratedCert (provider %q, set by MaybeDefaultWithSelfSignedCerts or by hand)", ss.ServerCert.GeneratedCert.Name()))
	}
	if len(given) > 0 {
		return fmt.Errorf("loopback.ApplyRecommendedOptions: %s, and %v were given too; choose one", what, given)
	}
	return nil
}

// applyServing sets info.Cert to opts.Serving or, when neither that nor the
// SecureServingOptions gave one, to the self-signed default.
func applyServing(info *server.SecureServingInfo, ss *options.SecureServingOptions, opts ApplyConfig) error {
	if opts.Serving != nil {
		info.Cert = opts.Serving
		return nil
	}
	if info.Cert != nil {
		return nil // certificate files or GeneratedCert
	}
	hosts := slices.Clone(authority.DefaultSelfSignedHosts)
	if ip := bindIP(info, ss); ip != nil && !ip.IsUnspecified() && !ip.IsLoopback() {
		hosts = append(hosts, ip.String())
	}
	hosts = append(hosts, opts.AlternateDNS...)
	for _, ip := range opts.AlternateIPs {
		hosts = append(hosts, ip.String())
	}
	hosts = uniqueInOrder(hosts) // DefaultSelfSignedHosts first, then in the order given
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Name:  DefaultServingName,
		Hosts: hosts,
		Clock: opts.Loopback.Clock,
	})
	if err != nil {
		return fmt.Errorf("self-signed serving certificate: %w", err)
	}
	info.Cert = serving
	return nil
}

// uniqueInOrder drops repeated names, keeping the first of each.
func uniqueInOrder(names []string) []string {
	seen := map[string]bool{}
	return slices.DeleteFunc(names, func(n string) bool {
		dup := seen[n]
		seen[n] = true
		return dup
	})
}

// bindIP returns the IP the server listens on, or nil.
func bindIP(info *server.SecureServingInfo, ss *options.SecureServingOptions) net.IP {
	if info.Listener != nil {
		if addr, ok := info.Listener.Addr().(*net.TCPAddr); ok {
			return addr.IP
		}
	}
	if ss != nil {
		return ss.BindAddress
	}
	return nil
}
