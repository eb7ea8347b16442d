package loopback

import (
	"errors"
	"fmt"

	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/rest"
)

// PostStartHookName is the name of the post-start hook that runs the
// loopback certificate's rotation loop.
const PostStartHookName = "loopback-certificate-rotation"

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
// The returned Certificate must be rotated by running its Run method.
// genericapiserver does that by itself once it serves (it runs every
// SNICerts provider that is a ControllerRunner until the server stops);
// AddPostStartHook makes it explicit. ApplyTo is not safe for concurrent use
// with other changes to *secureServingInfo.
func ApplyTo(secureServingInfo **server.SecureServingInfo, loopbackClientConfig **rest.Config, opts Options) (*Certificate, error) {
	if secureServingInfo == nil || *secureServingInfo == nil || loopbackClientConfig == nil {
		return nil, nil
	}
	info := *secureServingInfo
	cert, err := New(opts)
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
		*loopbackClientConfig = cfg
		return cert, nil
	}
}

// ApplyToConfig is a drop-in replacement for the loopback part of upstream's
// SecureServingOptionsWithLoopback.ApplyToConfig: ApplyTo on
// cfg.SecureServing and cfg.LoopbackClientConfig, then, when a Certificate
// was made, its HealthCheck is added to cfg's healthz and livez checks and
// its rotation post-start hook (PostStartHookName) to cfg. Apply the
// SecureServingOptions to cfg.SecureServing first.
func ApplyToConfig(cfg *server.Config, opts Options) (*Certificate, error) {
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
func (c *Certificate) PostStartHook() (string, server.PostStartHookFunc, error) {
	return PostStartHookName, func(hookCtx server.PostStartHookContext) error {
		go c.Run(hookCtx, 1)
		return nil
	}, nil
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
