// Package certmetrics defines every metric evercert exports, in one place, so
// that names stay consistent across packages. The metrics are registered in
// k8s.io/component-base's legacyregistry the first time any of them is used,
// and are served by whatever exposes that registry (server's /metrics, or a
// genericapiserver's). Collector hands the same metrics to another registry
// (a controller-runtime manager's, through the public package metrics).
//
// All functions are safe for concurrent use.
//
// See docs/architecture.md for how the packages fit together.
package certmetrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

const namespace = "evercert"

var (
	expiration = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      namespace,
		Name:           "certificate_expiration_timestamp_seconds",
		Help:           "NotAfter of the certificate a provider currently serves, as a Unix timestamp.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider"})

	rotations = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "certificate_rotations_total",
		Help:           "Number of times the certificate (or CA bundle) a provider serves changed after its first load; each change is counted once, by the component that parsed it.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider"})

	loadErrors = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "certificate_load_errors_total",
		Help:           "Number of distinct load failures of a provider (content rejected, or a read of it failed) while the last good content kept being served. A failure retried with the same error and the same content counts once; it counts again when the error or the content changes, or after a success.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider"})

	caBundlePublish = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "cabundle_publish_total",
		Help:           "Number of caBundle publish attempts by target kind and result (success, error, conflict, unchanged, contested).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"kind", "result"})

	loopbackSelfcheck = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "loopback_selfcheck_total",
		Help:           "Number of requests a server made to itself through its loopback client, by result (success, error).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})

	unsafeRotations = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "unsafe_rotations_total",
		Help:           "Number of times a CA signed leaves before every observer confirmed it, because no observed CA was valid any more (a pause longer than the CA's life, a clock jump). Clients must refresh their trust.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider"})

	recordedUnsafeRotations = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      namespace,
		Name:           "unsafe_rotations_recorded",
		Help:           "Number of unsafe rotations recorded in an Authority's CA Secret (annotation evercert.io/unsafe-rotations) by whichever replica made them, as this replica last read it: it survives the replica that made one, which unsafe_rotations_total does not.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider"})

	pendingObservers = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      namespace,
		Name:           "ca_rotation_pending_observers",
		Help:           "Number of observers (caBundle targets, bundle files, replicas) that have not yet confirmed the published successor CA; 0 when no successor is waiting.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider"})

	uncoveredTargets = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      namespace,
		Name:           "ca_rotation_uncovered_targets",
		Help:           "Number of caBundle targets declared in an Authority's CA Secret (annotation evercert.io/cabundle-targets) for which no live replica confirms the waiting successor CA (every replica that publishes to them is down): the successor waits for them. 0 when no successor is waiting.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider"})

	clockSkew = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "clock_skew_total",
		Help:           "Number of times an Authority replica found its clock disagreeing, beyond the skew tolerance, with the CA Secret or with the other replicas' Lease renewals. While it does, it does not write the Secret, issues no leaf and fails its ca-rotation readiness check.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider"})

	registerOnce sync.Once
)

// Register registers every evercert metric with the legacyregistry. It is
// idempotent, and every other function here calls it.
func Register() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(all()...)
	})
}

// CertificateLoaded records that provider now serves content that expires
// at notAfter. rotated is false for the provider's first content and true
// when it replaces earlier content, which counts one rotation. The caller
// reports each change exactly once: there is no de-duplication here.
func CertificateLoaded(provider string, notAfter time.Time, rotated bool) {
	CertificateExpiration(provider, notAfter)
	CertificateChanged(provider, rotated)
}

// CertificateExpiration sets provider's expiration gauge to notAfter.
func CertificateExpiration(provider string, notAfter time.Time) {
	Register()
	expiration.WithLabelValues(provider).Set(float64(notAfter.Unix()))
}

// CertificateChanged is CertificateLoaded without the expiration gauge,
// for a provider label several providers report under, whose expiration
// only the caller knows (the earliest of theirs).
func CertificateChanged(provider string, rotated bool) {
	Register()
	if rotated {
		rotations.WithLabelValues(provider).Inc()
	} else {
		// Make the series exist at 0 so alerts on rate() work from the start.
		rotations.WithLabelValues(provider).Add(0)
	}
	loadErrors.WithLabelValues(provider).Add(0)
}

// LoadError records one distinct load failure of provider. What is distinct
// is decided by internal/certreport, its only caller, so that every
// component counts failures the same way.
func LoadError(provider string) {
	Register()
	loadErrors.WithLabelValues(provider).Inc()
}

// CABundlePublished records one caBundle publish attempt.
func CABundlePublished(kind, result string) {
	Register()
	caBundlePublish.WithLabelValues(kind, result).Inc()
}

// LoopbackSelfcheck records one loopback self-check request.
func LoopbackSelfcheck(success bool) {
	Register()
	result := "success"
	if !success {
		result = "error"
	}
	loopbackSelfcheck.WithLabelValues(result).Inc()
}

// UnsafeRotation records that provider let a CA sign before it was
// observed, because no observed CA was valid any more.
func UnsafeRotation(provider string) {
	Register()
	unsafeRotations.WithLabelValues(provider).Inc()
}

// RecordedUnsafeRotations sets the count of unsafe rotations recorded in
// provider's CA Secret, as last read.
func RecordedUnsafeRotations(provider string, n int) {
	Register()
	recordedUnsafeRotations.WithLabelValues(provider).Set(float64(n))
}

// PendingObservers records how many observers have not yet confirmed
// provider's published successor CA (0 when none is waiting). It also makes
// evercert_unsafe_rotations_total exist at 0, so alerts on increase() work
// from the start.
func PendingObservers(provider string, n int) {
	Register()
	pendingObservers.WithLabelValues(provider).Set(float64(n))
	unsafeRotations.WithLabelValues(provider).Add(0)
}

// UncoveredTargets records how many caBundle targets declared in
// provider's CA Secret no live replica confirms the waiting successor for
// (0 when none is waiting).
func UncoveredTargets(provider string, n int) {
	Register()
	uncoveredTargets.WithLabelValues(provider).Set(float64(n))
}

// ClockSkew records that provider (an Authority replica) found its clock
// disagreeing with the CA Secret or its peers, when started is true; with
// false it only makes the series exist at 0, so alerts on increase() work
// from the start. The caller counts each episode once, when it starts.
func ClockSkew(provider string, started bool) {
	Register()
	c := clockSkew.WithLabelValues(provider)
	if started {
		c.Inc()
		return
	}
	c.Add(0)
}

// all lists every evercert collector.
func all() []metrics.Registerable {
	return []metrics.Registerable{expiration, rotations, loadErrors, caBundlePublish, loopbackSelfcheck, unsafeRotations, recordedUnsafeRotations, pendingObservers, uncoveredTargets, clockSkew,
		podCertificateRequests, podCertificateDuration, podCertificateWaiting, caBundleVerified, caBundleUnverified,
		emergencySteps, operatorRequests, compromisedTrusted, replicaAnnouncementsRejected, replicaLeaseWritesForbidden, foreignRewrites}
}

// Gatherer gathers evercert's own metrics only. Gathering the whole
// legacyregistry also runs every other component's collectors in the
// process, and a collector of a stopped component (an API server's storage
// monitor whose etcd is gone) can take tens of seconds to answer; tests read
// evercert's values through this instead.
func Gatherer() prometheus.Gatherer {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	return reg
}

// Collector returns one prometheus.Collector of every evercert metric, the
// same series the legacyregistry serves, for a Prometheus registry that is
// not the legacyregistry (a controller-runtime manager serves its own).
// It holds evercert's metrics only, none of the process and Go collectors
// the legacyregistry also has, which such a registry has its own of. Every
// call returns a collector with the same descriptors, so a registry given
// it a second time refuses it with prometheus.AlreadyRegisteredError
// instead of serving each series twice.
func Collector() prometheus.Collector {
	// Register creates the metrics: a component-base metric has no
	// Prometheus metric behind it until a KubeRegistry created it.
	Register()
	return collector{}
}

// collector is Collector's value: it describes and collects all().
type collector struct{}

// Describe sends every evercert metric's descriptors.
func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range all() {
		c.Describe(ch)
	}
}

// Collect sends every evercert series.
func (collector) Collect(ch chan<- prometheus.Metric) {
	for _, c := range all() {
		c.Collect(ch)
	}
}
