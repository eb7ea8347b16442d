package certmetrics

import (
	"time"

	"k8s.io/component-base/metrics"
)

// Results of a PodCertificateRequest, the values of the result label.
const (
	// PodCertificateIssued: this replica wrote the Issued status.
	PodCertificateIssued = "issued"
	// PodCertificateDenied: this replica wrote the Denied status.
	PodCertificateDenied = "denied"
	// PodCertificateFailed: this replica wrote the Failed status.
	PodCertificateFailed = "failed"
	// PodCertificateConflict: another replica (or signer) wrote the final
	// status first; this replica's write lost the race and was dropped.
	PodCertificateConflict = "conflict"
)

var podCertificateResults = []string{PodCertificateIssued, PodCertificateDenied, PodCertificateFailed, PodCertificateConflict}

var (
	podCertificateRequests = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "podcertificate_requests_total",
		Help:           "Number of PodCertificateRequests a signer replica finished, by signer name and result (issued, denied, failed; conflict: another replica wrote the final status first).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"signer", "result"})

	podCertificateDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Namespace: namespace,
		Name:      "podcertificate_request_duration_seconds",
		Help:      "Time from a signer replica first seeing a PodCertificateRequest to its final status being written, by signer name and result.",
		// 5 ms to about 5.5 min: an issuance takes milliseconds; one that
		// waits for a CA rotation or backs off from API errors, minutes.
		Buckets:        metrics.ExponentialBuckets(0.005, 2, 17),
		StabilityLevel: metrics.ALPHA,
	}, []string{"signer", "result"})

	podCertificateWaiting = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      namespace,
		Name:           "podcertificate_requests_waiting",
		Help:           "Number of open PodCertificateRequests a signer replica cannot sign yet because its CA has not been read or ends too soon for the lifetime asked for (its successor waits to be observed), by signer name.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"signer"})
)

// PodCertificateSignerStarted makes every result series of signer exist at
// 0, so alerts on increase() work from the start, and its waiting gauge.
func PodCertificateSignerStarted(signer string) {
	Register()
	for _, r := range podCertificateResults {
		podCertificateRequests.WithLabelValues(signer, r).Add(0)
	}
	podCertificateWaiting.WithLabelValues(signer).Add(0)
}

// PodCertificateWaiting sets how many open requests to signer wait for the
// CA on this replica.
func PodCertificateWaiting(signer string, n int) {
	Register()
	podCertificateWaiting.WithLabelValues(signer).Set(float64(n))
}

// PodCertificateRequestDone records that a request to signer ended with
// result (one of the PodCertificate* results) took after this replica first
// saw it.
func PodCertificateRequestDone(signer, result string, took time.Duration) {
	Register()
	podCertificateRequests.WithLabelValues(signer, result).Inc()
	podCertificateDuration.WithLabelValues(signer, result).Observe(took.Seconds())
}
