// Package metrics hands evercert's metrics to a Prometheus registry that is
// not component-base's legacyregistry. evercert registers its metrics in the
// legacyregistry, which server's /metrics and a genericapiserver serve; a
// program that serves another registry registers Collector there to serve
// them too. A controller-runtime manager serves its own registry, and
// github.com/evercert/evercert/controllerruntime's Add registers Collector
// in it, so a manager's program needs no line of its own. The metrics, their
// labels and what they mean are listed in docs/reference.md, generated from
// this collector.
//
// See docs/architecture.md for how the packages fit together.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/evercert/evercert/internal/certmetrics"
)

// Collector returns a prometheus.Collector of every evercert metric
// (evercert_*), the same series the legacyregistry serves, with the same
// names and labels. It holds nothing else: no process or Go collector,
// which the registry it is given has its own of. Every call returns a
// collector with the same descriptors, so a registry that already has one
// refuses another with a prometheus.AlreadyRegisteredError instead of
// serving each series twice.
func Collector() prometheus.Collector {
	return certmetrics.Collector()
}
