package server

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/sni"
)

// ServingCertificateCheckName is the name of ServingCertificateCheck.
const ServingCertificateCheckName = "serving-certificate"

// ServingCertificateCheck returns the health check "serving-certificate". It
// fails before the controller's first sync and whenever any certificate the
// controller serves has expired at clk's time; the message names which.
//
// It is a readiness check, for /readyz and /healthz, never /livez: an
// expired certificate from a file or a Secret is fixed by whoever renews
// that file or Secret, and a restart would only bring the same certificate
// back (a restart loop, with the old one still served in between).
func ServingCertificateCheck(c *sni.DynamicServingCertificateController, clk clock.PassiveClock) healthz.HealthChecker {
	return healthz.NamedCheck(ServingCertificateCheckName, func(*http.Request) error {
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

// ClientCACheckName is the name of ClientCACheck.
const ClientCACheckName = "client-ca"

// ClientCACheck returns the health check "client-ca" for a server that
// verifies client certificates against clientCA (--client-ca-file). It
// fails before the controller's first sync, while the controller verifies
// against no client CA at all (the bundle never loaded: no client
// certificate can verify, every one is refused), and when every CA of the
// bundle has expired at clk's time; the message names the provider and,
// when its last load failed, that failure.
//
// A bundle that breaks after it loaded (rewritten with garbage, emptied,
// deleted) does not fail the check: the last good bundle keeps verifying,
// and the failure is counted in evercert_certificate_load_errors_total
// and logged by the provider. Taking every replica out of traffic for a
// bad write of a shared file would turn it into an outage.
//
// Like serving-certificate, it is a readiness check (/readyz, /healthz),
// never /livez: a restart reads the same file again.
func ClientCACheck(c *sni.DynamicServingCertificateController, clientCA dynamiccertificates.CAContentProvider, clk clock.PassiveClock) healthz.HealthChecker {
	return healthz.NamedCheck(ClientCACheckName, func(*http.Request) error {
		if !c.HasSynced() {
			return errors.New("no client CA loaded yet")
		}
		var cas []sni.ServedCertificate
		for _, sc := range c.Served() {
			if sc.Role == sni.RoleClientCA {
				cas = append(cas, sc)
			}
		}
		if len(cas) == 0 {
			msg := fmt.Sprintf("no client CA loaded from %s: client certificates cannot be verified", clientCA.Name())
			if le, ok := clientCA.(interface{ LastError() error }); ok {
				if err := le.LastError(); err != nil {
					return fmt.Errorf("%s: %w", msg, err)
				}
			}
			return errors.New(msg)
		}
		now := clk.Now()
		var expired []string
		for _, ca := range cas {
			if now.Before(ca.NotAfter) {
				// One valid CA is enough for the bundle to verify; an
				// expired one beside it is normal during a CA rotation.
				return nil
			}
			expired = append(expired, fmt.Sprintf("%s (expired %s)", ca.Subject, ca.NotAfter.UTC().Format(time.RFC3339)))
		}
		return fmt.Errorf("every client CA of %s has expired: %s", clientCA.Name(), strings.Join(expired, ", "))
	})
}

// HealthChecks are a caller's own checks for InstallHandlersWithChecks,
// grouped by what a failure calls for.
type HealthChecks struct {
	// Liveness checks fail only when a restart would help: a rotation loop
	// that stalled, say (loopback's HealthCheck). They are served on /livez,
	// /readyz and /healthz, as a genericapiserver's AddHealthChecks does.
	Liveness []healthz.HealthChecker
	// Readiness checks fail while the server should get no traffic but a
	// restart would not help: a caBundle not yet published, an expired
	// certificate someone else must renew. They are served on /readyz and
	// /healthz, never on /livez.
	Readiness []healthz.HealthChecker
}

// InstallHandlers adds /healthz, /livez, /readyz and /metrics (the
// legacyregistry, where evercert's metrics live) to mux. checks are
// liveness checks, served on all three health endpoints; see
// InstallHandlersWithChecks for readiness-only checks and for which check
// is on which endpoint.
func (s *Serving) InstallHandlers(mux *http.ServeMux, checks ...healthz.HealthChecker) {
	s.InstallHandlersWithChecks(mux, HealthChecks{Liveness: checks})
}

// InstallHandlersWithChecks adds the health endpoints and /metrics to mux:
//
//   - /livez: checks.Liveness only (a ping when there are none). A failing
//     /livez should make the kubelet restart the process, so nothing a
//     restart cannot fix is on it.
//   - /readyz: serving-certificate, client-ca (with --client-ca-file, see
//     ClientCACheck), ca-rotation:<provider> (for the self-signed default
//     and --ca-secret: fails while a CA rotation is stalled, see
//     authority.RotationCheck), checks.Liveness and checks.Readiness.
//   - /healthz: the same as /readyz; it is the legacy endpoint that reports
//     every check, not a liveness probe.
//
// Each check is also served on its own, as /readyz/NAME and so on.
func (s *Serving) InstallHandlersWithChecks(mux *http.ServeMux, checks HealthChecks) {
	certmetrics.Register()
	live := slices.Clone(checks.Liveness)
	all := []healthz.HealthChecker{ServingCertificateCheck(s.Controller, s.opts.Clock)}
	if s.ClientCA != nil {
		all = append(all, ClientCACheck(s.Controller, s.ClientCA, s.opts.Clock))
	}
	all = append(all, checks.Liveness...)
	if r, ok := s.TrustBundle.(authority.RotationReporter); ok {
		// A stalled CA rotation waits for an observer; a restart does not
		// help, so it is a readiness check.
		all = append(all, authority.RotationCheck(r))
	}
	all = append(all, checks.Readiness...)
	healthz.InstallHandler(mux, all...)
	healthz.InstallLivezHandler(mux, live...)
	healthz.InstallReadyzHandler(mux, all...)
	mux.Handle("/metrics", legacyregistry.Handler())
}
