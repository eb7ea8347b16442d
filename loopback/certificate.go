package loopback

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
)

const (
	// ServerName is the name the loopback certificate is made for and the
	// only SNI name it is served for. The loopback client sends it as SNI
	// and verifies the server certificate against it. It equals upstream's
	// server.LoopbackClientServerNameOverride.
	ServerName = server.LoopbackClientServerNameOverride
	// ProviderName names the provider in logs and in the provider label of
	// evercert's certificate metrics.
	ProviderName = "loopback"
)

// Certificate is a rotating loopback certificate: a CA and a leaf for
// ServerName, made and rotated in memory. It implements the upstream
// SNICertKeyContentProvider (so it goes into SecureServingInfo.SNICerts),
// CAContentProvider (the bundle of every CA that is still valid) and
// ControllerRunner (Run rotates; RunOnce rotates what is due now).
//
// Every new connection made through a rest.Config from RestConfig, or through
// WrapTransport, is verified against the current CA bundle, so a client never
// needs rebuilding. All methods are safe for concurrent use.
type Certificate struct {
	ss        *authority.SelfSigned
	opts      CertificateConfig
	transport *http.Transport
	trust     trust
	// runSem serializes Run: the genericapiserver's serving code and a
	// post-start hook may both start it.
	runSem chan struct{}
	// appliedToken is the bearer token of the loopback client config
	// ApplyTo set from this Certificate, or nil; the post-start hook checks
	// that the server still uses that config.
	appliedToken atomic.Pointer[string]
}

var (
	_ dynamiccertificates.SNICertKeyContentProvider = &Certificate{}
	_ dynamiccertificates.CAContentProvider         = &Certificate{}
	_ dynamiccertificates.ControllerRunner          = &Certificate{}
)

// New validates opts, fills in their defaults and makes the first CA and
// leaf, so the Certificate serves and verifies as soon as it returns.
func NewCertificate(opts CertificateConfig) (*Certificate, error) {
	if err := opts.complete(); err != nil {
		return nil, fmt.Errorf("loopback certificate: %w", err)
	}
	ss, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Name:        ProviderName,
		CommonName:  ServerName,
		Hosts:       []string{ServerName},
		SNINames:    []string{ServerName},
		KeyTypes:    []dynamiccert.KeyType{opts.KeyType},
		Lifetime:    opts.Validity,
		RenewBefore: opts.RenewBefore,
		Clock:       opts.Clock,
	})
	if err != nil {
		return nil, fmt.Errorf("loopback certificate: %w", err)
	}
	c := &Certificate{ss: ss, opts: opts, runSem: make(chan struct{}, 1)}
	c.trust = trust{bundle: ss.CurrentCABundleContent, now: opts.Clock.Now}
	c.transport = newTransport(&c.trust)
	// Connections verified against a superseded certificate stay usable
	// (TLS does not re-verify), but idle ones are dropped at every change so
	// the next request handshakes with, and verifies, the new certificate.
	ss.AddListener(listenerFunc(c.transport.CloseIdleConnections))
	return c, nil
}

// Config returns the configuration in force, defaults filled in.
func (c *Certificate) Config() CertificateConfig { return c.opts }

// Name returns ProviderName.
func (c *Certificate) Name() string { return c.ss.Name() }

// CurrentCertKeyContent returns the current leaf certificate and private key
// PEM. Callers must not modify the returned slices.
func (c *Certificate) CurrentCertKeyContent() ([]byte, []byte) { return c.ss.CurrentCertKeyContent() }

// CurrentParsedCertKeyContent returns the current leaf PEM together with the
// leaf ready to serve, so evercert's sni controller serves it without
// parsing it again (sni.ParsedCertKeyProvider).
func (c *Certificate) CurrentParsedCertKeyContent() ([]byte, []byte, *tls.Certificate) {
	return c.ss.CurrentParsedCertKeyContent()
}

// SNINames returns []string{ServerName}: the leaf is selected for that SNI
// name only, never as a default or for an IP (see NameOnly).
func (c *Certificate) SNINames() []string { return c.ss.SNINames() }

// NameOnly returns true: the loopback certificate is an internal identity.
// evercert's sni controller (sni.NameOnlyProvider) therefore serves it only
// to clients that send ServerName, never as the default certificate, and
// lets it win that name whatever the order of the providers.
func (c *Certificate) NameOnly() bool { return true }

// CurrentCABundleContent returns the PEM bundle of every CA that is still
// valid, including a successor CA that does not sign yet. Callers must not
// modify the returned slice.
func (c *Certificate) CurrentCABundleContent() []byte { return c.ss.CurrentCABundleContent() }

// VerifyOptions returns options verifying against the current CA bundle, as
// upstream CAContentProvider implementations do (client-auth usage).
func (c *Certificate) VerifyOptions() (x509.VerifyOptions, bool) { return c.ss.VerifyOptions() }

// AddListener registers l to be notified (Enqueue) whenever the leaf or the
// CA bundle changes. Listeners must not block.
func (c *Certificate) AddListener(l dynamiccertificates.Listener) { c.ss.AddListener(l) }

// Leaf returns the current leaf certificate.
func (c *Certificate) Leaf() *x509.Certificate { return c.ss.Leaf() }

// RenewAt returns when the current leaf is due to be replaced.
func (c *Certificate) RenewAt() time.Time { return c.ss.RenewAt() }

// LastError returns the error of the last rotation attempt, or nil.
func (c *Certificate) LastError() error { return c.ss.LastError() }

// RunOnce rotates, synchronously, whatever is due at the clock's current
// time. Tests that drive a fake clock call it after each step.
func (c *Certificate) RunOnce(ctx context.Context) error { return c.ss.RunOnce(ctx) }

// Run rotates the certificate on schedule until ctx is done; workers is
// ignored. At most one Run is active per Certificate: a second call waits
// until the first returns (then takes over) or its own ctx is done, so it is
// safe to start Run from both the serving code and a post-start hook.
func (c *Certificate) Run(ctx context.Context, workers int) {
	select {
	case c.runSem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-c.runSem }()
	c.ss.Run(ctx, workers)
}

type listenerFunc func()

func (f listenerFunc) Enqueue() { f() }
