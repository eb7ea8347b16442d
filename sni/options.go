package sni

import (
	"crypto/tls"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
)

// DefaultName is the name of the work queue and of the controller in logs
// when WithName is not given.
const DefaultName = "DynamicServingCertificateController"

// DefaultResyncInterval is how often the controller re-reads its providers
// even when none of them reported a change, when WithResyncInterval is not
// given. It matches upstream's one-minute recheck, which catches providers
// that do not notify, and certificates that were not yet valid when they
// were first read.
const DefaultResyncInterval = time.Minute

// Option configures a DynamicServingCertificateController. Options are
// applied in order by NewDynamicServingCertificateController; a later option
// overrides an earlier one.
type Option func(*options)

type options struct {
	clock         clock.PassiveClock
	clientAuth    tls.ClientAuthType
	clientAuthSet bool
	name          string
	resync        time.Duration
	eventRecorder events.EventRecorder
	eventObject   runtime.Object
}

func defaultOptions() options {
	return options{
		clock:  clock.RealClock{},
		name:   DefaultName,
		resync: DefaultResyncInterval,
	}
}

// WithClock sets the clock used to check a certificate's NotBefore and
// NotAfter when new content is parsed. The default is clock.RealClock{}. A
// nil clock is ignored. The clock is only read, never waited on: the resync
// ticker always runs on real time.
func WithClock(c clock.PassiveClock) Option {
	return func(o *options) {
		if c != nil {
			o.clock = c
		}
	}
}

// WithClientAuth sets the tls.ClientAuthType of the served config. Without
// it, a non-zero base.ClientAuth is kept; otherwise the default is
// tls.VerifyClientCertIfGiven when a client CA provider is set, so that a
// client certificate that is presented must chain to the current client CA
// bundle, and tls.NoClientCert when none is.
func WithClientAuth(auth tls.ClientAuthType) Option {
	return func(o *options) {
		o.clientAuth = auth
		o.clientAuthSet = true
	}
}

// WithName sets the name of the controller's work queue and the name it logs
// under. The default is DefaultName. An empty name is ignored.
func WithName(name string) Option {
	return func(o *options) {
		if name != "" {
			o.name = name
		}
	}
}

// WithResyncInterval sets how often Run re-reads every provider even without
// a notification. The default is DefaultResyncInterval; zero or a negative
// value disables the periodic resync. A resync of unchanged providers costs
// no parsing and swaps nothing.
func WithResyncInterval(d time.Duration) Option {
	return func(o *options) {
		o.resync = d
	}
}

// WithEventRecorder sends Kubernetes Events through recorder, about object
// (the Pod, say), for what the controller reports itself: a Normal
// CertificateRotated Event for each new certificate it parsed (from a
// provider that is not a ParsedCertKeyProvider), and a Warning
// CertificateLoadFailed Event for each distinct content it rejects. evercert's
// providers send Events about their own changes and failures: give them the
// same recorder and object in their configs (EventRecorder, EventObject).
// Default: no Events; a nil recorder or object sends none.
func WithEventRecorder(recorder events.EventRecorder, object runtime.Object) Option {
	return func(o *options) {
		o.eventRecorder, o.eventObject = recorder, object
	}
}
