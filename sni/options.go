package sni

import (
	"crypto/tls"
	"errors"
	"fmt"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
)

// DefaultName is the name of the work queue and of the controller in logs
// when ControllerConfig.Name is empty.
const DefaultName = "DynamicServingCertificateController"

// DefaultResyncInterval is how often the controller re-reads its providers
// even when none of them reported a change, when
// ControllerConfig.ResyncInterval is zero. It matches upstream's one-minute
// recheck, which catches providers that do not notify, and certificates that
// were not yet valid when they were first read.
const DefaultResyncInterval = time.Minute

// DefaultPerProviderMetricsLimit is ControllerConfig.PerProviderMetricsLimit
// when it is zero: up to 1,000 providers (3,000 series) stay one series
// each, as they always were; more are reported together.
const DefaultPerProviderMetricsLimit = 1000

// ControllerConfig configures a DynamicServingCertificateController. Every
// field is optional, but at least one of Serving and SNI must be set; the
// zero value of each field gives the default documented on it.
type ControllerConfig struct {
	// Base is the static part of every served config: versions, cipher
	// suites, ALPN. It is cloned, so later changes to it have no effect;
	// its Certificates, GetCertificate and GetConfigForClient are ignored.
	// Default: MinVersion TLS 1.2 and NextProtos "h2", "http/1.1", so that
	// an http.Server serving the controller's config speaks HTTP/2 as it
	// does with a static config.
	Base *tls.Config

	// Serving is the default certificate, served when no SNI certificate
	// matches. Providers may be evercert's or upstream's.
	Serving dynamiccertificates.CertKeyContentProvider
	// SNI are the certificates selected by name, in precedence order: when
	// two claim a name with certificates of the same key algorithm, the
	// earlier wins. nil entries are skipped; a nil pointer of a provider
	// type (a non-nil interface holding nil), here or in Serving or
	// ClientCA, is an error. Without Serving, the first
	// valid SNI certificate is the default.
	SNI []dynamiccertificates.SNICertKeyContentProvider
	// ClientCA, when set, verifies client certificates.
	ClientCA dynamiccertificates.CAContentProvider

	// ClientAuth is the served config's tls.ClientAuthType. Default (the
	// zero value, tls.NoClientCert): Base.ClientAuth when that is set;
	// otherwise tls.VerifyClientCertIfGiven with a ClientCA, so that a
	// client certificate that is presented must chain to the current client
	// CA bundle, and tls.NoClientCert without one. A type that verifies
	// client certificates needs ClientCA.
	ClientAuth tls.ClientAuthType

	// Clock checks a certificate's NotBefore and NotAfter when new content
	// is parsed, and, when set and Base.Time is not, is the served
	// config's Time: client certificates are verified on it too. It is only
	// read, never waited on: the resync ticker always runs on real time.
	// Default clock.RealClock{} (and crypto/tls's default Time).
	Clock clock.WithTicker
	// Name is the name of the controller's work queue and the name it logs
	// under. Default DefaultName.
	Name string
	// ResyncInterval is how often Run re-reads every provider even without
	// a notification. A resync of unchanged providers costs no parsing and
	// swaps nothing. Default DefaultResyncInterval; a negative value
	// disables the periodic resync.
	ResyncInterval time.Duration

	// EventRecorder, with EventObject (the object the Events are about: the
	// Pod, say), receives Kubernetes Events for what the controller reports
	// itself: a Normal CertificateRotated Event for each new certificate it
	// parsed (from a provider that is not a ParsedCertKeyProvider), and a
	// Warning CertificateLoadFailed Event for each distinct content it
	// rejects. evercert's providers send Events about their own changes and
	// failures: give them the same recorder and object in their configs.
	// Default: no Events; either nil sends none.
	EventRecorder events.EventRecorder
	EventObject   runtime.Object

	// PerProviderMetricsLimit is how many providers the controller reports
	// metrics for one by one. It concerns the providers whose content the
	// controller parses itself, those that are not ParsedCertKeyProvider
	// (evercert's providers report their own metrics). Each costs three
	// series (evercert_certificate_expiration_timestamp_seconds,
	// _rotations_total and _load_errors_total, labelled with its name);
	// with more of them than the limit, which at 100,000 SNI certificates
	// is a cardinality problem for Prometheus and about a quarter of the
	// controller's memory, they are reported together under one label,
	// provider=<Name>: the rotations and load errors of all of them, and the
	// earliest NotAfter among the certificates they serve, so that expiry
	// alerts and rate() keep working. Log lines and Events still name each
	// provider. The choice is made once, at construction. Default (zero)
	// DefaultPerProviderMetricsLimit; a negative value always reports them
	// together.
	PerProviderMetricsLimit int
}

// options is a ControllerConfig with its defaults filled in.
type options struct {
	clock         clock.PassiveClock
	name          string
	resync        time.Duration
	eventRecorder events.EventRecorder
	eventObject   runtime.Object
	// metricsLimit is PerProviderMetricsLimit; negative: none one by one.
	metricsLimit int
}

// complete validates cfg, naming the field at fault, and returns the
// options it gives and the base config to clone.
func (cfg ControllerConfig) complete() (options, *tls.Config, error) {
	o := options{clock: cfg.Clock, name: cfg.Name, resync: cfg.ResyncInterval, eventRecorder: cfg.EventRecorder, eventObject: cfg.EventObject,
		metricsLimit: cfg.PerProviderMetricsLimit}
	if o.metricsLimit == 0 {
		o.metricsLimit = DefaultPerProviderMetricsLimit
	}
	if cfg.Clock == nil {
		o.clock = clock.RealClock{}
	}
	if o.name == "" {
		o.name = DefaultName
	}
	switch {
	case o.resync == 0:
		o.resync = DefaultResyncInterval
	case o.resync < 0:
		o.resync = 0 // disabled
	}
	base := cfg.Base
	if base == nil {
		base = &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	}
	if err := cfg.checkTypedNil(); err != nil {
		return o, nil, err
	}
	if cfg.Serving == nil && !hasProvider(cfg.SNI) {
		return o, nil, errors.New("ControllerConfig: neither Serving nor SNI is set, so there is nothing to serve")
	}
	auth := cfg.ClientAuth
	if auth == tls.NoClientCert {
		auth = base.ClientAuth
	}
	if auth >= tls.VerifyClientCertIfGiven && cfg.ClientCA == nil {
		field := "ClientAuth"
		if cfg.ClientAuth == tls.NoClientCert {
			field = "Base.ClientAuth"
		}
		return o, nil, fmt.Errorf("ControllerConfig.%s %v verifies client certificates but ControllerConfig.ClientCA is not set", field, auth)
	}
	return o, base, nil
}

func hasProvider(ps []dynamiccertificates.SNICertKeyContentProvider) bool {
	for _, p := range ps {
		if p != nil {
			return true
		}
	}
	return false
}

// checkTypedNil refuses a provider that is a nil pointer (or other nil
// value) of a concrete type: the interface holding it is not nil, so it
// would pass for a provider and panic at its first method call.
func (cfg ControllerConfig) checkTypedNil() error {
	if isTypedNil(cfg.Serving) {
		return fmt.Errorf("ControllerConfig.Serving is a nil %T", cfg.Serving)
	}
	for i, p := range cfg.SNI {
		if isTypedNil(p) {
			return fmt.Errorf("ControllerConfig.SNI[%d] is a nil %T; leave nil providers out, or use a nil interface, which is skipped", i, p)
		}
	}
	if isTypedNil(cfg.ClientCA) {
		return fmt.Errorf("ControllerConfig.ClientCA is a nil %T", cfg.ClientCA)
	}
	return nil
}

// isTypedNil reports whether v is a non-nil interface holding a nil value.
func isTypedNil(v any) bool {
	if v == nil {
		return false
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
