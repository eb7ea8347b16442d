package certmetrics

import "k8s.io/component-base/metrics"

var (
	caBundleVerified = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      namespace,
		Name:           "cabundle_verified",
		Help:           "1 when the CA bundle published into an object (as read back from the API server) verifies every certificate chain served, 0 when it does not: that server's clients fail their handshakes. By target kind and object name.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"kind", "name"})

	caBundleUnverified = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "cabundle_unverified_total",
		Help:           "Number of times the CA bundle published into an object stopped verifying a served certificate chain (one per episode), by target kind and object name. Counts episodes too short for a scrape of evercert_cabundle_verified to see.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"kind", "name"})
)

// CABundleVerified records whether the bundle published into the object
// kind/name verifies every served chain.
func CABundleVerified(kind, name string, ok bool) {
	Register()
	v := 0.0
	if ok {
		v = 1
	}
	caBundleVerified.WithLabelValues(kind, name).Set(v)
	caBundleUnverified.WithLabelValues(kind, name).Add(0)
}

// CABundleUnverifiedEpisode records that the bundle published into the
// object kind/name stopped verifying a served chain.
func CABundleUnverifiedEpisode(kind, name string) {
	Register()
	caBundleUnverified.WithLabelValues(kind, name).Inc()
}

// CABundleVerificationForgotten drops the series of a deleted object, so
// that objects coming and going do not accumulate series.
func CABundleVerificationForgotten(kind, name string) {
	Register()
	caBundleVerified.DeleteLabelValues(kind, name)
	caBundleUnverified.DeleteLabelValues(kind, name)
}
