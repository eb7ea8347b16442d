package certmetrics

import "k8s.io/component-base/metrics"

var foreignRewrites = metrics.NewCounterVec(&metrics.CounterOpts{
	Namespace:      namespace,
	Name:           "ca_secret_foreign_rewrites_total",
	Help:           "Number of rewrites of an Authority's CA Secret by another rotator (in the layout the Authority adopts, with a CA the Authority never had) that an Authority replica saw after it adopted or wrote the Secret: the old rotator still runs. Each rewrite is counted once per replica. While they go on, the replica adopts nothing and reports Stalled; its ca-rotation readiness check stays green while it serves a valid leaf.",
	StabilityLevel: metrics.ALPHA,
}, []string{"provider"})

// ForeignRewrite records that provider (an Authority replica) saw its CA
// Secret rewritten by another rotator after it adopted or wrote it.
func ForeignRewrite(provider string) {
	Register()
	foreignRewrites.WithLabelValues(provider).Inc()
}
