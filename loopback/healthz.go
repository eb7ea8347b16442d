package loopback

import (
	"fmt"
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
)

// HealthCheckName is the name of the loopback certificate health check, as
// upstream's.
const HealthCheckName = "loopback-serving-certificate"

// HealthCheck returns the "loopback-serving-certificate" check for healthz
// and livez. Unlike upstream's, which fails once the never-rotated loopback
// certificate expires, it fails only when rotation has stalled, judged at the
// Certificate clock's time:
//
//   - the current leaf has expired, or
//   - it is still served more than CertificateConfig.Grace after its renewal time.
//
// Its error says how long the leaf has left (or since when it expired) and
// the last rotation error, if any; a passing check logs the time left at
// verbosity 5. It is safe for concurrent use.
func (c *Certificate) HealthCheck() healthz.HealthChecker {
	return healthCheck{c}
}

type healthCheck struct{ c *Certificate }

func (h healthCheck) Name() string { return HealthCheckName }

func (h healthCheck) Check(*http.Request) error {
	now := h.c.opts.Clock.Now()
	leaf := h.c.Leaf()
	renewAt := h.c.RenewAt()
	left := leaf.NotAfter.Sub(now)
	var problem string
	switch {
	case !now.Before(leaf.NotAfter):
		problem = fmt.Sprintf("loopback serving certificate expired %v ago (at %s)", (-left).Round(time.Millisecond), leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.After(renewAt.Add(h.c.opts.Grace)):
		problem = fmt.Sprintf("loopback serving certificate rotation has stalled: renewal was due %v ago, grace %v; %v of validity left",
			now.Sub(renewAt).Round(time.Millisecond), h.c.opts.Grace, left.Round(time.Millisecond))
	default:
		klog.Background().V(5).Info("Loopback serving certificate is current", "validityLeft", left, "renewAt", renewAt)
		return nil
	}
	if err := h.c.LastError(); err != nil {
		return fmt.Errorf("%s: last rotation error: %w", problem, err)
	}
	return fmt.Errorf("%s", problem)
}
