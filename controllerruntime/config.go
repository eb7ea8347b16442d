package controllerruntime

import (
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
)

// CheckName is the name under which Add registers its health and ready
// checks on the manager (/healthz/evercert, /readyz/evercert).
const CheckName = "evercert"

// ServingSource provides the serving certificate when Config.Source replaces
// the default Authority: dynamiccert.SelfSigned, FileCertKey, SecretCertKey,
// or any other provider. If it also has a Run(ctx context.Context, workers
// int) method, as every evercert provider does, Add runs it as a manager
// Runnable on every replica.
type ServingSource interface {
	dynamiccertificates.CertKeyContentProvider
}

// Config configures Add. Every field but those marked required has a
// default, used when it is left zero.
type Config struct {
	// Namespace and SecretName name the CA Secret the default Authority
	// keeps. Required unless Source is set.
	Namespace, SecretName string
	// ServiceName is the name of the webhook Service in Namespace. The
	// leaf's Hosts then default to <svc>, <svc>.<ns>, <svc>.<ns>.svc and
	// <svc>.<ns>.svc.cluster.local, and named targets are restricted to the
	// caBundle fields whose client configuration refers to this Service
	// (fields of other Services or URLs are left alone). Without it the
	// named targets get every caBundle field.
	ServiceName string
	// Hosts of the leaf (DNS names and IPs), replacing those derived from
	// ServiceName. One of Hosts and ServiceName is required with the
	// Authority.
	Hosts []string
	// Authority tunes the default source (Lifetime, CALifetime,
	// PropagationDelay, KeyTypes, ...). Add fills in Namespace, SecretName,
	// Hosts, Client (built from the manager's rest.Config), EventRecorder
	// (the manager's) and Clock when they are unset. Ignored with Source.
	Authority dynamiccert.AuthorityConfig
	// Source replaces the Authority with another serving provider. CABundle
	// is then what the targets receive; it is required when any target is
	// named, and run by Add (if it has a Run method) unless it is the same
	// object as Source.
	Source   ServingSource
	CABundle dynamiccertificates.CAContentProvider
	// ValidatingWebhooks, MutatingWebhooks, CRDs and APIServices name the
	// ValidatingWebhookConfigurations, MutatingWebhookConfigurations,
	// CustomResourceDefinitions (their conversion webhook) and APIServices
	// that receive the CA bundle. The objects need not exist yet.
	ValidatingWebhooks, MutatingWebhooks, CRDs, APIServices []string
	// Targets are further cabundle targets (by selector, say), added to
	// those named above.
	Targets []cabundle.Target
	// Clock drives rotation and validity checks of every part. Default the
	// real clock.
	Clock clock.WithTicker
}
