// Package certreport turns what happens to the content a certificate
// provider serves into what operators see: log lines, metrics and
// Kubernetes Events. It exists so that each change and each failure is
// reported exactly once, by one owner: the component that parsed the
// content. evercert's providers parse (and so report) their own content; the
// sni controller reports only the content it had to parse itself, that of
// providers from outside evercert.
//
// A change of certificate is one Info line at the default verbosity
// (provider, subject, serial, NotAfter, issuer; never key material or PEM),
// one update of evercert_certificate_expiration_timestamp_seconds, one
// increment of evercert_certificate_rotations_total when it replaces an
// earlier certificate, and then one Normal Event (ReasonCertificateRotated).
//
// A load failure is counted in evercert_certificate_load_errors_total,
// logged at error level and sent as a Warning Event
// (ReasonCertificateLoadFailed) once per distinct failure: a failure is
// distinct when its error message or the content it was about (see
// WithContent) differs from the previous failure's, or when a success came
// in between. Retrying the same bad file, the same bad Secret or the same API
// error any number of times is one failure.
//
// See docs/architecture.md for how the packages fit together.
package certreport

import (
	"crypto/x509"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/errlog"
)

// Event reasons and actions. The reasons are re-exported by dynamiccert,
// where users look for them.
const (
	// ReasonCertificateRotated (Normal): a provider serves a new
	// certificate in place of an earlier one.
	ReasonCertificateRotated = "CertificateRotated"
	// ReasonCertificateLoadFailed (Warning): a provider's new content, or
	// reading it, failed; the last good certificate is still served.
	ReasonCertificateLoadFailed = "CertificateLoadFailed"
	// ReasonUnsafeCARotation (Warning): a CA signed before every observer
	// confirmed it, because no observed CA was valid any more.
	ReasonUnsafeCARotation = "UnsafeCARotation"
	// ReasonClockSkew (Warning): an Authority replica's clock disagrees
	// with the CA Secret or with the other replicas beyond the skew
	// tolerance; it does not write the Secret until it agrees again.
	ReasonClockSkew = "ClockSkew"
	// ReasonEmergencyCARotation (Warning): a step of an emergency rotation
	// away from a compromised CA.
	ReasonEmergencyCARotation = "EmergencyCARotation"
	// ReasonCARotationRequested (Normal): an operator's rotate request was
	// acted on.
	ReasonCARotationRequested = "CARotationRequested"
	// ReasonCARequestIgnored (Warning): an operator's request named no CA
	// the Authority holds.
	ReasonCARequestIgnored = "CARequestIgnored"
	// ReasonCASecretRepaired (Warning): an Authority found its CA Secret
	// edited into content it must not use as it is (a part that does not
	// parse, a signing CA that no bundle publishes) and wrote back what it
	// holds.
	ReasonCASecretRepaired = "CASecretRepaired"
	// ReasonForeignCASecretWriter (Warning): another rotator keeps
	// rewriting an Authority's CA Secret in its own layout after the
	// Authority adopted it; the Authority holds until it stops.
	ReasonForeignCASecretWriter = "ForeignCASecretWriter"

	// ActionRotate is the action of rotation Events; ActionLoad that of load
	// failures.
	ActionRotate = "Rotate"
	ActionLoad   = "Load"
)

// maxNote is the longest Event note the API server accepts (events.k8s.io
// validation: 1 KiB).
const maxNote = 1024

// Reporter reports one provider's changes and failures. The zero value is
// not usable: create it with New. It is safe for concurrent use.
type Reporter struct {
	provider string
	// metrics is the provider label of the metrics; aggregated is set when
	// it is shared with other providers (NewAggregated).
	metrics    string
	aggregated bool
	recorder   events.EventRecorder
	object     runtime.Object

	// failures tells distinct failures from retries of the last one.
	failures errlog.Once

	// mu guards loaded, and makes recording a failure and counting it one
	// step for LastError: whoever sees a failure there also sees it in
	// evercert_certificate_load_errors_total.
	mu     sync.Mutex
	loaded bool // a certificate was reported: the next one is a rotation
}

// New returns a Reporter for provider. Events are sent when both recorder
// and object (the object they are about: the Pod, the Secret the content
// comes from) are set; either may be nil to send none.
func New(provider string, recorder events.EventRecorder, object runtime.Object) *Reporter {
	return &Reporter{provider: provider, metrics: provider, recorder: recorder, object: object}
}

// NewAggregated returns a Reporter for provider whose metrics count under
// the provider label label, shared with other providers, so that many
// providers cost a few series instead of three each: Loaded and
// BundleLoaded count rotations (and make the series exist) as for a
// provider of its own but leave
// evercert_certificate_expiration_timestamp_seconds to the caller, which
// knows the NotAfter of them all; Failed counts under label. Log lines and
// Events name provider, as New's do.
func NewAggregated(provider, label string, recorder events.EventRecorder, object runtime.Object) *Reporter {
	return &Reporter{provider: provider, metrics: label, aggregated: true, recorder: recorder, object: object}
}

// Provider returns the provider name the Reporter reports for.
func (r *Reporter) Provider() string { return r.provider }

// Loaded reports that the provider now serves leaf: one Info line with the
// leaf's subject, serial, NotAfter and issuer plus keysAndValues, the
// metrics, and on a rotation (not the first certificate) a Normal Event. The
// caller must report each change once; reporting the same certificate again
// would count another rotation.
func (r *Reporter) Loaded(leaf *x509.Certificate, keysAndValues ...any) {
	r.mu.Lock()
	rotated := r.loaded
	r.loaded = true
	r.mu.Unlock()

	r.countLoaded(leaf.NotAfter, rotated)
	serial := leaf.SerialNumber.Text(16)
	notAfter := leaf.NotAfter.UTC().Format(time.RFC3339)
	klog.Background().Info("Loaded certificate", append([]any{"provider", r.provider,
		"subject", leaf.Subject.CommonName, "serial", serial, "notAfter", notAfter,
		"issuer", leaf.Issuer.CommonName, "rotated", rotated}, keysAndValues...)...)
	if rotated {
		r.Event(corev1.EventTypeNormal, ReasonCertificateRotated, ActionRotate,
			fmt.Sprintf("provider %s serves a new certificate: subject %q, serial %s, issuer %q, valid until %s",
				r.provider, leaf.Subject.CommonName, serial, leaf.Issuer.CommonName, notAfter))
	}
}

// BundleLoaded reports that the provider now serves the CA bundle certs:
// one Info line (the number of CAs, their subjects, the latest NotAfter)
// and the metrics, whose expiration is the latest NotAfter: the bundle is
// useful until its last CA expires, and an expired CA is expected in it
// during a rotation. No Event: a bundle change is not a certificate change.
func (r *Reporter) BundleLoaded(certs []*x509.Certificate, keysAndValues ...any) {
	r.mu.Lock()
	rotated := r.loaded
	r.loaded = true
	r.mu.Unlock()

	var notAfter time.Time
	subjects := make([]string, len(certs))
	for i, c := range certs {
		if c.NotAfter.After(notAfter) {
			notAfter = c.NotAfter
		}
		subjects[i] = c.Subject.CommonName
	}
	r.countLoaded(notAfter, rotated)
	klog.Background().Info("Loaded CA bundle", append([]any{"provider", r.provider,
		"certificates", len(certs), "subjects", subjects, "notAfter", notAfter.UTC().Format(time.RFC3339),
		"rotated", rotated}, keysAndValues...)...)
}

// countLoaded updates the metrics for a load of content expiring at
// notAfter.
func (r *Reporter) countLoaded(notAfter time.Time, rotated bool) {
	if r.aggregated {
		certmetrics.CertificateChanged(r.metrics, rotated)
		return
	}
	certmetrics.CertificateLoaded(r.metrics, notAfter, rotated)
}

// Failed records err, which must name the source, as the provider's newest
// failure. A distinct failure (see the package documentation) is counted,
// logged with keysAndValues and sent as a Warning Event, and Failed returns
// true; a repeat of the previous failure only updates LastError.
func (r *Reporter) Failed(err error, keysAndValues ...any) (distinct bool) {
	// Errors name the source and carry subjects and dates at most, never
	// key material or PEM (pki's errors are written so), so they are safe
	// to log and to send.
	r.mu.Lock()
	distinct = r.failures.Error(klog.Background(), err, "Rejected new content; the last good content, if any, is still served",
		append([]any{"provider", r.provider}, keysAndValues...)...)
	if distinct {
		certmetrics.LoadError(r.metrics)
	}
	r.mu.Unlock()
	if !distinct {
		return false
	}
	r.Event(corev1.EventTypeWarning, ReasonCertificateLoadFailed, ActionLoad,
		fmt.Sprintf("provider %s: %v; the last good content, if any, is still served", r.provider, err))
	return true
}

// Succeeded records a successful load and reports whether it ended a
// failure; a failure after it is distinct again.
func (r *Reporter) Succeeded() (recovered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures.Reset()
}

// LastError returns the newest failure, or nil if the last load succeeded.
// A failure is returned only once it is counted in the metrics.
func (r *Reporter) LastError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures.Err()
}

// Event sends an Event about the configured object, if there is a recorder
// and an object. note is sent as is (not as a format), cut to the length the
// API server accepts, between characters.
func (r *Reporter) Event(eventtype, reason, action, note string) {
	if r.recorder == nil || r.object == nil {
		return
	}
	if len(note) > maxNote {
		// Cut between characters: the bytes of a cut one would become
		// U+FFFD, three bytes each, in the JSON sent to the API server,
		// which would then refuse the note as too long.
		cut := maxNote - 3
		for cut > 0 && !utf8.RuneStart(note[cut]) {
			cut--
		}
		note = note[:cut] + "..."
	}
	r.recorder.Eventf(r.object, nil, eventtype, reason, action, "%s", note)
}

// WithContent returns err marked as being about content, so that a new bad
// content with the same message is a distinct failure; see
// errlog.WithContent.
func WithContent(err error, content ...[]byte) error { return errlog.WithContent(err, content...) }
