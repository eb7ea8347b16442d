package loopback

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/client-go/rest"
)

// PostStartHookName is the name of the post-start hook that runs the
// loopback certificate's rotation loop.
const PostStartHookName = "loopback-certificate-rotation"

// ErrWrongOrder is wrapped by the errors of ApplyTo, ApplyToConfig and
// ApplyRecommendedOptions when the configuration already holds a loopback
// (upstream's, made by SecureServingOptionsWithLoopback.ApplyTo, which
// RecommendedOptions.ApplyTo calls, or an earlier evercert one), and by the
// rotation post-start hook when another loopback client config replaced
// evercert's. Either way the server would otherwise run with two loopbacks:
// a client that trusts one certificate while the server serves the other.
var ErrWrongOrder = errors.New("loopback applied in the wrong order")

// ApplyTo is a drop-in replacement for the loopback part of upstream's
// SecureServingOptionsWithLoopback.ApplyTo. The caller first applies its
// SecureServingOptions (SecureServingOptions.ApplyTo(secureServingInfo));
// ApplyTo then makes a rotating loopback Certificate from opts, puts it first
// in (*secureServingInfo).SNICerts, so it wins ServerName over any other
// certificate, and sets *loopbackClientConfig to c.RestConfig for the
// listener's address with a new random token.
//
// Semantics mirror upstream:
//
//   - If secureServingInfo, *secureServingInfo or loopbackClientConfig is nil
//     (secure serving is off), ApplyTo does nothing and returns nil, nil.
//   - If the loopback client config cannot be made (for instance there is no
//     listener) and *loopbackClientConfig is nil, the certificate is removed
//     from SNICerts again and the error is returned.
//   - If it cannot be made but *loopbackClientConfig is already set (usually
//     an insecure fallback), that config is kept, the certificate stays in
//     SNICerts and is returned, and the error is dropped.
//   - Otherwise *loopbackClientConfig is replaced.
//
// Unlike upstream, a loopback applied before is an error wrapping
// ErrWrongOrder, and nothing changes: if an SNI certificate in
// *secureServingInfo already claims ServerName, SecureServingOptionsWithLoopback
// (or RecommendedOptions.ApplyTo, or ApplyTo) ran first, and any client
// config made from it would not trust evercert's certificate.
//
// The returned Certificate must be rotated by running its Run method.
// genericapiserver does that by itself once it serves (it runs every
// SNICerts provider that is a ControllerRunner until the server stops);
// AddPostStartHook makes it explicit. ApplyTo is not safe for concurrent use
// with other changes to *secureServingInfo.
func ApplyTo(secureServingInfo **server.SecureServingInfo, loopbackClientConfig **rest.Config, opts CertificateConfig) (*Certificate, error) {
	if secureServingInfo == nil || *secureServingInfo == nil || loopbackClientConfig == nil {
		return nil, nil
	}
	info := *secureServingInfo
	if p := loopbackSNICert(info); p != nil {
		return nil, fmt.Errorf("%w: the serving configuration already has a certificate for %q (provider %q), so a loopback was applied before: "+
			"upstream's SecureServingOptionsWithLoopback.ApplyTo (which RecommendedOptions.ApplyTo calls) or loopback.ApplyTo. "+
			"Apply plain SecureServingOptions before loopback.ApplyTo, or call loopback.ApplyRecommendedOptions instead of RecommendedOptions.ApplyTo",
			ErrWrongOrder, ServerName, p.Name())
	}
	cert, err := NewCertificate(opts)
	if err != nil {
		return nil, fmt.Errorf("failed to generate self-signed certificate for loopback connection: %w", err)
	}
	// First, so that it overrides any other certificate with the same name.
	info.SNICerts = append([]dynamiccertificates.SNICertKeyContentProvider{cert}, info.SNICerts...)

	var cfg *rest.Config
	if info.Listener == nil {
		err = errors.New("secure serving has no listener")
	} else {
		cfg, err = cert.RestConfig(info.Listener.Addr().String(), "")
	}
	switch {
	case err != nil && *loopbackClientConfig == nil:
		info.SNICerts = info.SNICerts[1:]
		return nil, fmt.Errorf("loopback client config: %w", err)
	case err != nil:
		// Keep the existing fallback config, as upstream does.
		return cert, nil
	default:
		cert.appliedToken.Store(&cfg.BearerToken)
		*loopbackClientConfig = cfg
		return cert, nil
	}
}

// loopbackSNICert returns the first SNI certificate of info that claims
// ServerName, or nil.
func loopbackSNICert(info *server.SecureServingInfo) dynamiccertificates.SNICertKeyContentProvider {
	for _, p := range info.SNICerts {
		for _, name := range p.SNINames() {
			if strings.EqualFold(name, ServerName) {
				return p
			}
		}
	}
	return nil
}

// ApplyToConfig is a drop-in replacement for the loopback part of upstream's
// SecureServingOptionsWithLoopback.ApplyToConfig: ApplyTo on
// cfg.SecureServing and cfg.LoopbackClientConfig, then, when a Certificate
// was made, its HealthCheck is added to cfg's healthz and livez checks and
// its rotation post-start hook (PostStartHookName) to cfg. Apply the
// SecureServingOptions to cfg.SecureServing first.
//
// A loopback applied before, upstream's or evercert's, is an error wrapping
// ErrWrongOrder, and cfg is left unchanged: an SNI certificate for
// ServerName (see ApplyTo), a HealthCheckName check or the PostStartHookName
// hook already in cfg. So calling ApplyToConfig after RecommendedOptions.ApplyTo
// fails at once; use ApplyRecommendedOptions instead.
func ApplyToConfig(cfg *server.Config, opts CertificateConfig) (*Certificate, error) {
	if err := checkNoLoopback(cfg); err != nil {
		return nil, err
	}
	cert, err := ApplyTo(&cfg.SecureServing, &cfg.LoopbackClientConfig, opts)
	if err != nil || cert == nil {
		return cert, err
	}
	check := cert.HealthCheck()
	cfg.AddHealthzChecks(check)
	cfg.AddLivezChecks(check)
	if err := cert.AddPostStartHook(cfg); err != nil {
		return nil, err
	}
	return cert, nil
}

// checkNoLoopback returns an error wrapping ErrWrongOrder if cfg already
// holds a loopback health check or evercert's rotation hook.
func checkNoLoopback(cfg *server.Config) error {
	for _, checks := range [][]healthz.HealthChecker{cfg.HealthzChecks, cfg.LivezChecks} {
		for _, c := range checks {
			if c.Name() == HealthCheckName {
				return fmt.Errorf("%w: the config already has a %q health check, so a loopback was applied before: "+
					"upstream's SecureServingOptionsWithLoopback.ApplyToConfig (which RecommendedOptions.ApplyTo calls) or loopback.ApplyToConfig. "+
					"Call loopback.ApplyRecommendedOptions instead of RecommendedOptions.ApplyTo, or apply plain SecureServingOptions before loopback.ApplyToConfig",
					ErrWrongOrder, HealthCheckName)
			}
		}
	}
	if _, ok := cfg.PostStartHooks[PostStartHookName]; ok {
		return fmt.Errorf("%w: the config already has the post-start hook %q: loopback.ApplyToConfig ran on it before", ErrWrongOrder, PostStartHookName)
	}
	return nil
}

// PostStartHookAdder is implemented by *server.Config and
// *server.GenericAPIServer.
type PostStartHookAdder interface {
	AddPostStartHook(name string, hook server.PostStartHookFunc) error
}

// PostStartHook implements server.PostStartHookProvider. The hook starts Run
// in a goroutine bounded by the hook context, which is cancelled when the
// server stops, and returns at once (so readiness does not wait for it).
// Running it next to genericapiserver's own Run of the SNI provider is
// harmless: only one Run is active at a time.
//
// When ApplyTo set a loopback client config from this Certificate, the hook
// first checks that the server still uses it (same bearer token). If
// something replaced it afterwards — upstream's
// SecureServingOptionsWithLoopback.ApplyTo or ApplyToConfig called on its
// own after loopback's, which also replaces the SecureServingInfo and so
// drops evercert's certificate — the hook returns an error wrapping
// ErrWrongOrder, which genericapiserver treats as fatal: the server exits at
// start, naming the cause, instead of running on upstream's never-rotated
// loopback certificate. RecommendedOptions.ApplyTo called after
// ApplyRecommendedOptions never gets this far: it returns ErrWrongOrder
// itself (see ApplyRecommendedOptions).
func (c *Certificate) PostStartHook() (string, server.PostStartHookFunc, error) {
	return PostStartHookName, func(hookCtx server.PostStartHookContext) error {
		if err := c.checkInUse(hookCtx.LoopbackClientConfig); err != nil {
			return err
		}
		go c.Run(hookCtx, 1)
		return nil
	}, nil
}

// checkInUse returns an error wrapping ErrWrongOrder if ApplyTo set a
// loopback client config from c and cfg is not that config (or a copy).
func (c *Certificate) checkInUse(cfg *rest.Config) error {
	want := c.appliedToken.Load()
	if want == nil {
		return nil // not applied by ApplyTo: nothing to compare with
	}
	if cfg == nil || cfg.BearerToken != *want {
		return fmt.Errorf("%w: the server's loopback client config is not the one loopback.ApplyTo made, "+
			"so something replaced it afterwards, typically upstream's SecureServingOptionsWithLoopback.ApplyTo or ApplyToConfig "+
			"called after loopback.ApplyTo, ApplyToConfig or ApplyRecommendedOptions; the server would run on upstream's never-rotated loopback certificate. "+
			"Apply only one loopback: loopback.ApplyRecommendedOptions replaces RecommendedOptions.ApplyTo", ErrWrongOrder)
	}
	return nil
}

// AddPostStartHook registers PostStartHook on s, a *server.Config or a
// *server.GenericAPIServer. It fails if a hook of that name already exists.
func (c *Certificate) AddPostStartHook(s PostStartHookAdder) error {
	name, hook, err := c.PostStartHook()
	if err != nil {
		return err
	}
	return s.AddPostStartHook(name, hook)
}
