package controllerruntime

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
)

// CheckName is the name under which Add registers its health and ready
// checks on the manager (/healthz/evercert and /readyz/evercert on the
// manager's health probe address).
const CheckName = "evercert"

// ServingSource provides the serving certificate when Config.Source replaces
// the default Authority: authority.SelfSigned, FileCertKey, SecretCertKey,
// StaticCertKey, or any other provider. If it also has a Run(ctx
// context.Context, workers int) method, as every evercert provider that
// changes does, Add runs it as a manager Runnable on every replica.
type ServingSource interface {
	dynamiccertificates.CertKeyContentProvider
}

// runner is a provider with a Run loop (dynamiccert's and authority's providers, the
// publisher, the sni controller).
type runner interface {
	Run(ctx context.Context, workers int)
}

// Config configures Add. Every field not marked required has a default,
// used when it is left zero.
type Config struct {
	// Namespace and SecretName name the CA Secret the default Authority
	// keeps (it creates the Secret if it is missing, unless
	// Authority.DisableCreate). Required unless Source is set.
	Namespace, SecretName string
	// ServiceName is the name of the webhook Service in Namespace; the
	// leaf's Hosts then default to <svc>, <svc>.<ns>, <svc>.<ns>.svc and
	// <svc>.<ns>.svc.cluster.local. It only derives Hosts: named targets
	// get every caBundle field of the object whatever it refers to (use
	// Targets with a cabundle.Target.Service to restrict them).
	ServiceName string
	// Hosts of the leaf (DNS names and IPs), replacing those derived from
	// ServiceName. With the Authority, one of Hosts and ServiceName is
	// required.
	Hosts []string
	// Authority tunes the default source (Lifetime, CALifetime,
	// PropagationDelay, KeyTypes, ReplicaID, ...). Its Namespace and
	// SecretName are always those above; Add fills in Hosts, Client (built
	// from the manager's rest.Config and HTTP client), EventRecorder (the
	// manager's, events.k8s.io API), Clock, and ReplicaID (the environment
	// variable POD_NAME, authority.PodNameEnv: set it from the downward
	// API, so a restarted process keeps its replica's Lease) when they are
	// unset. Ignored when Source is set.
	Authority authority.Config
	// Source replaces the Authority with another serving provider.
	Source ServingSource
	// CABundle is what the targets receive. Default the Authority's ca.crt;
	// required with Source when there is any target. Add runs it (if it has
	// a Run method) unless it is the same object as Source. If it has an
	// AddObserver(authority.Observer) method (SelfSigned, Authority), the
	// publisher is added as an observer, so a successor CA signs only once
	// every target holds it.
	CABundle dynamiccertificates.CAContentProvider
	// ValidatingWebhooks, MutatingWebhooks, CRDs and APIServices name the
	// ValidatingWebhookConfigurations, MutatingWebhookConfigurations,
	// CustomResourceDefinitions (their conversion webhook) and APIServices
	// that receive the CA bundle. The objects need not exist yet: Ready
	// waits for them.
	ValidatingWebhooks, MutatingWebhooks, CRDs, APIServices []string
	// Targets are further cabundle targets (by label selector, say), added
	// after those named above.
	Targets []cabundle.Target
	// Clock drives rotation, validity checks and the publisher's timers.
	// Default the real clock.
	Clock clock.WithTicker
}

// hosts returns the leaf's hosts: Hosts, or those of ServiceName.
func (cfg *Config) hosts() []string {
	if len(cfg.Hosts) > 0 {
		return cfg.Hosts
	}
	if cfg.ServiceName == "" || cfg.Namespace == "" {
		return nil
	}
	svc, ns := cfg.ServiceName, cfg.Namespace
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
}

// targets returns the named targets followed by Targets.
func (cfg *Config) targets() []cabundle.Target {
	var out []cabundle.Target
	for _, l := range []struct {
		kind  cabundle.Kind
		names []string
	}{
		{cabundle.ValidatingWebhookConfiguration, cfg.ValidatingWebhooks},
		{cabundle.MutatingWebhookConfiguration, cfg.MutatingWebhooks},
		{cabundle.CustomResourceDefinition, cfg.CRDs},
		{cabundle.APIService, cfg.APIServices},
	} {
		for _, n := range l.names {
			out = append(out, cabundle.Target{Kind: l.kind, Name: n})
		}
	}
	return append(out, cfg.Targets...)
}

// validate checks what Add needs before it builds anything; its errors name
// the field (the publisher's own validation names the target).
func (cfg *Config) validate() error {
	if cfg.Source == nil {
		switch {
		case cfg.Namespace == "":
			return errors.New("Config.Namespace is required with the default Authority (the namespace of the CA Secret); or set Config.Source")
		case cfg.SecretName == "":
			return errors.New("Config.SecretName is required with the default Authority (the name of the CA Secret); or set Config.Source")
		case len(cfg.hosts()) == 0:
			return errors.New("Config.Hosts is empty and Config.ServiceName is not set: the leaf needs at least one host")
		}
		return nil
	}
	if cfg.CABundle == nil && len(cfg.targets()) > 0 {
		return fmt.Errorf("Config.CABundle is required with Config.Source when targets are named (%d targets): it is what they receive", len(cfg.targets()))
	}
	return nil
}
