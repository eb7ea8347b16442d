package controllerruntime

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/sni"
)

// readyPoll is how often the ready gate looks at the serving controller and
// the publisher until both have synced (cache.WaitForCacheSync's period).
const readyPoll = 100 * time.Millisecond

// Certs is what Add wired into a manager. Its methods are safe for
// concurrent use.
type Certs struct {
	clock     clock.PassiveClock
	source    ServingSource
	rotation  authority.RotationReporter // nil for sources without a CA rotation
	publisher *cabundle.Publisher        // nil without targets
	ctrl      *sni.DynamicServingCertificateController
	ready     chan struct{}
}

// TLSOpts returns an option for webhook.Options.TLSOpts (or any framework's
// tls.Config, such as an aggregated API server's) that sets GetCertificate
// to the sni controller's and changes nothing else, so the framework's
// client authentication, version floor and ALPN stay in force. Do not set
// GetConfigForClient on a framework's config: Go would then use evercert's
// config for the whole handshake (see docs/embedding.md). Add already appends it
// to the manager's default webhook server.
func (c *Certs) TLSOpts() func(*tls.Config) { return c.ctrl.SetGetCertificate }

// Ready returns a channel closed once a certificate is served and every
// caBundle target holds the bundle (cert-controller's IsReady): the point
// from which the API server can call the webhook. It is never closed if the
// manager stops before. With no targets it waits for the certificate only.
func (c *Certs) Ready() <-chan struct{} { return c.ready }

// waitReady closes ready once the serving controller has a certificate and
// the publisher has published to every target, or returns when ctx is done.
func (c *Certs) waitReady(ctx context.Context) {
	err := wait.PollUntilContextCancel(ctx, readyPoll, true, func(context.Context) (bool, error) { return c.gateOpen(), nil })
	if err != nil {
		return // stopped before
	}
	close(c.ready)
}

// gateOpen reports whether a certificate is served and the publisher (if
// any) has published to every target.
func (c *Certs) gateOpen() bool {
	return c.ctrl.HasSynced() && (c.publisher == nil || c.publisher.HasSynced())
}

// ReadyzCheck returns the readiness check Add registers as CheckName. It
// fails until Ready is closed, naming what is missing; then while the
// certificate this replica serves is expired (by Config.Clock), a target
// does not hold the bundle or it does not verify this replica's leaf, its
// caBundle is contested by another writer (see cabundle's
// Publisher.HealthCheck), or the CA rotation is stalled or this replica's
// clock is skewed (authority.RotationCheck, for the Authority and
// SelfSigned). It makes no API call.
func (c *Certs) ReadyzCheck() healthz.Checker {
	return func(req *http.Request) error {
		var problems []string
		select {
		case <-c.ready:
		default:
			problems = append(problems, "not ready: "+c.waiting())
		}
		if err := c.expired(); err != nil {
			problems = append(problems, err.Error())
		}
		if c.publisher != nil {
			if err := c.publisher.HealthCheck().Check(req); err != nil {
				problems = append(problems, "caBundle: "+err.Error())
			}
		}
		if c.rotation != nil {
			if err := authority.RotationCheck(c.rotation).Check(req); err != nil {
				problems = append(problems, "CA rotation: "+err.Error())
			}
		}
		if len(problems) == 0 {
			return nil
		}
		return errors.New(strings.Join(problems, "; "))
	}
}

// waiting says what Ready still waits for.
func (c *Certs) waiting() string {
	var w []string
	if !c.ctrl.HasSynced() {
		w = append(w, "no certificate served yet")
	}
	if c.publisher != nil && !c.publisher.HasSynced() {
		w = append(w, "the caBundle is not yet published to every target")
	}
	if len(w) == 0 {
		return "starting"
	}
	return strings.Join(w, ", ")
}

// HealthzCheck returns the liveness check Add registers as CheckName. It
// fails only for what a restart would fix: the certificate this replica
// serves has expired (by Config.Clock) although it was served once, so its
// rotation loop is stuck. It passes before the first certificate (start-up
// is the readiness check's business) and while the API server cannot be
// reached or the CA Secret cannot be written, which a restart does not
// fix and would only take the last good certificate away.
func (c *Certs) HealthzCheck() healthz.Checker {
	return func(*http.Request) error { return c.expired() }
}

// expired returns an error when the default certificate this replica serves
// has expired, nil when it is valid or none is served yet.
func (c *Certs) expired() error {
	now := c.clock.Now()
	for _, s := range c.ctrl.Served() {
		if s.Role == sni.RoleServing && s.IsDefault && !now.Before(s.NotAfter) {
			return fmt.Errorf("the served certificate %s (serial %s) expired at %s", s.Subject, s.Serial, s.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	return nil
}
