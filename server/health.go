package server

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/sni"
)

// ServingCertificateCheck returns the health check "serving-certificate". It
// fails before the controller's first sync and whenever any certificate the
// controller serves has expired at clk's time; the message names which.
// It fits k8s.io/apiserver's healthz, readyz and livez handlers.
func ServingCertificateCheck(c *sni.DynamicServingCertificateController, clk clock.PassiveClock) healthz.HealthChecker {
	return healthz.NamedCheck("serving-certificate", func(*http.Request) error {
		if !c.HasSynced() {
			return errors.New("no serving certificate loaded yet")
		}
		now := clk.Now()
		var expired []string
		for _, sc := range c.Served() {
			// An expired CA may legitimately linger in a client CA bundle
			// during rotation; only what the server presents counts.
			if sc.Role != sni.RoleClientCA && !now.Before(sc.NotAfter) {
				expired = append(expired, fmt.Sprintf("%s (expired %s)", sc.Provider, sc.NotAfter.UTC().Format(time.RFC3339)))
			}
		}
		if len(expired) > 0 {
			return fmt.Errorf("serving expired certificates: %s", strings.Join(expired, ", "))
		}
		return nil
	})
}

// InstallHandlers adds /healthz, /livez and /readyz (each with the
// serving-certificate check plus checks) and /metrics (the legacyregistry,
// where evercert's metrics live) to mux.
func (s *Serving) InstallHandlers(mux *http.ServeMux, checks ...healthz.HealthChecker) {
	certmetrics.Register()
	all := append([]healthz.HealthChecker{ServingCertificateCheck(s.Controller, s.opts.Clock)}, checks...)
	healthz.InstallHandler(mux, all...)
	healthz.InstallLivezHandler(mux, all...)
	healthz.InstallReadyzHandler(mux, all...)
	mux.Handle("/metrics", legacyregistry.Handler())
}
