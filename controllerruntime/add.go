package controllerruntime

import (
	"crypto/tls"
	"errors"

	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/sni"
)

// Certs is what Add wired into a manager. Its methods are safe for
// concurrent use.
type Certs struct {
	source    ServingSource
	bundle    interface{ CurrentCABundleContent() []byte }
	publisher *cabundle.Publisher
	ctrl      *sni.DynamicServingCertificateController
	ready     chan struct{}
}

// Add wires everything into mgr as Runnables with NeedLeaderElection()
// false (every replica serves its own leaf): the source (Authority by
// default), the cabundle.Publisher for the targets and the sni controller.
// When mgr.GetWebhookServer() is a *webhook.DefaultServer (the default), Add
// appends TLSOpts() to its Options.TLSOpts, so the webhook server (admission
// and conversion) serves evercert's certificate with no other line. It
// registers HealthzCheck and ReadyzCheck on mgr under CheckName. Add must be
// called before mgr.Start.
func Add(mgr manager.Manager, cfg Config) (*Certs, error) {
	return nil, errors.New("not implemented yet")
}

// TLSOpts returns an option for webhook.Options.TLSOpts (or any
// framework's tls.Config) that sets GetCertificate and nothing else, so the
// framework's client authentication, version floor and ALPN stay in force.
func (c *Certs) TLSOpts() func(*tls.Config) { return c.ctrl.SetGetCertificate }

// Ready returns a channel closed once a certificate is served and every
// caBundle target holds the bundle (cert-controller's IsReady).
func (c *Certs) Ready() <-chan struct{} { return c.ready }

// ReadyzCheck fails until Ready, and while the served certificate is
// missing or expired or a target lost the bundle.
func (c *Certs) ReadyzCheck() healthz.Checker { return healthz.Ping }

// HealthzCheck is the liveness check: it fails only for what a restart
// would fix.
func (c *Certs) HealthzCheck() healthz.Checker { return healthz.Ping }
