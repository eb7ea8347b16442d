package authority

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// Defaults for SelfSignedConfig.
const (
	// DefaultSelfSignedLifetime is the default lifetime of a self-signed leaf.
	DefaultSelfSignedLifetime = 30 * 24 * time.Hour
	// DefaultSkewTolerance is the clock skew tolerated by default between
	// replicas and clients.
	DefaultSkewTolerance = time.Hour
	// DefaultCheckInterval bounds how long the provider goes without looking
	// at the wall clock, so a suspended machine or a clock jump renews
	// promptly even though timers were asleep.
	DefaultCheckInterval = time.Minute
	// MinReissueInterval is the floor between two leaves of one SelfSigned
	// or Authority (and so of the loopback certificate), measured on its
	// Clock: whatever the configuration and whatever the CA state does, a
	// leaf is replaced no sooner than this after the previous one was
	// issued. It caps key generation, signing, "Loaded certificate" log
	// lines, Events and listener notifications at two per second should a
	// schedule ever be due when its leaf is issued (X.509 validity has
	// one-second resolution, so a faster successor could not last longer
	// anyway). It is half of MinLifetime so that it never delays the
	// renewal of the shortest leaf past the middle of its life. It does not
	// hold the first leaf back, nor a clock that went back before the last
	// issuance.
	MinReissueInterval = 500 * time.Millisecond
	// MinLifetime is the shortest leaf Lifetime accepted. X.509 cannot
	// express a shorter validity, and with it a leaf held back by
	// MinReissueInterval still has half its life left.
	MinLifetime = 2 * MinReissueInterval
)

// DefaultSelfSignedHosts are the names a self-signed certificate is made for
// when none are given.
var DefaultSelfSignedHosts = []string{"localhost", "127.0.0.1", "::1"}

// SelfSignedConfig configures a SelfSigned provider. The zero value is
// usable: an ECDSA P-256 leaf for DefaultSelfSignedHosts, valid for
// DefaultSelfSignedLifetime, renewed at 2/3 of its life, signed by a CA that
// lives three leaf lifetimes.
type SelfSignedConfig struct {
	// Name identifies the provider in logs and metrics. Default "self-signed".
	Name string
	// CommonName of the leaf. Default: the first DNS name in Hosts, else Name.
	CommonName string
	// Hosts are the DNS names and IP addresses the leaf is valid for, each
	// as ValidateHost accepts it. Default DefaultSelfSignedHosts.
	Hosts []string
	// SNINames, when set, replace the names taken from the certificate for
	// SNI selection (see sni). Default nil.
	SNINames []string
	// KeyTypes are the key types of the leaves: one leaf per type, for the
	// same names, signed by the same CA and renewed together. The first is
	// served by CurrentCertKeyContent; each further one by a provider of
	// Alternatives, which the sni controller serves side by side, giving
	// each client the first leaf it supports, ECDSA first. Default
	// [ECDSAP256]; a type may be listed once. The CA's key is of the first
	// RSA type listed, if any (so a client that can only verify RSA can
	// verify every leaf's chain), else of the first type; it takes effect
	// with the next CA.
	KeyTypes []dynamiccert.KeyType
	// Lifetime of the leaf. Default DefaultSelfSignedLifetime; at least
	// MinLifetime, at most MaxLifetime (MaxLifetime/3 while CALifetime is
	// defaulted). NotAfter is rounded up to a whole second.
	Lifetime time.Duration
	// RenewBefore is how long before the leaf expires it is replaced.
	// Default Lifetime/3.
	RenewBefore time.Duration
	// CALifetime is the lifetime of each CA. Default 3*Lifetime; at most
	// MaxLifetime.
	CALifetime time.Duration
	// CARenewBefore is how long before the signing CA expires its successor
	// is made and joins the CA bundle. Default CALifetime/3. It must exceed
	// RenewBefore, so a leaf is never signed by a CA about to expire.
	CARenewBefore time.Duration
	// PropagationDelay is the minimum time a successor CA sits in the
	// bundle before it signs leaves, for consumers evercert cannot observe
	// (clients that read the bundle file or the CA bundle on their own
	// schedule). The successor also waits for every Observer. Default
	// (CARenewBefore-RenewBefore)/4, so a successor published when the
	// machine wakes from a pause of 0.9 CA lifetimes still signs before the
	// old CA expires.
	PropagationDelay time.Duration
	// SkewTolerance is the clock skew tolerated between this process, its
	// clients and (for an Authority) other replicas: certificates are
	// backdated by it, and a CA not yet valid by less than it is accepted.
	// It must cover the largest disagreement between any two of them:
	// replicas at -1h and +1h need 2h. Default one hour, or RenewBefore/4
	// when that is shorter. It must be shorter than the CA lifetime.
	SkewTolerance time.Duration
	// Observers confirm that a published successor CA has reached the
	// consumers they stand for; it signs only once all have (see Observer
	// and AddObserver). Default none: only PropagationDelay.
	Observers []Observer
	// EventRecorder, with EventObject, receives a Normal CertificateRotated
	// Event for every new leaf, a Warning CertificateLoadFailed Event for
	// every distinct failure to rotate, and a Warning UnsafeCARotation
	// Event on an unsafe rotation. Optional: no Events without both.
	EventRecorder events.EventRecorder
	// EventObject is the object Events are about, e.g. the Pod. Optional.
	EventObject runtime.Object
	// CheckInterval bounds the time between wall-clock checks. Default
	// DefaultCheckInterval, or Lifetime/10 when that is shorter.
	CheckInterval time.Duration
	// Clock drives rotation and validity. Default clock.RealClock{}.
	Clock clock.WithTicker
}

func (c *SelfSignedConfig) complete() error {
	if c.Name == "" {
		c.Name = "self-signed"
	}
	if len(c.Hosts) == 0 {
		c.Hosts = DefaultSelfSignedHosts
	}
	if c.CommonName == "" {
		c.CommonName = c.Name
		for _, h := range c.Hosts {
			if net.ParseIP(h) == nil {
				c.CommonName = h
				break
			}
		}
	}
	kts, err := completeKeyTypes(c.KeyTypes)
	if err != nil {
		return fmt.Errorf("key types: %w", err)
	}
	c.KeyTypes = kts
	if c.Lifetime == 0 {
		c.Lifetime = DefaultSelfSignedLifetime
	}
	if err := checkLifetimes(c.Lifetime, c.CALifetime, 3); err != nil {
		return err // before the defaults below overflow
	}
	if c.RenewBefore == 0 {
		c.RenewBefore = c.Lifetime / 3
	}
	if c.CALifetime == 0 {
		c.CALifetime = 3 * c.Lifetime
	}
	if c.CARenewBefore == 0 {
		c.CARenewBefore = c.CALifetime / 3
	}
	if c.PropagationDelay == 0 {
		c.PropagationDelay = (c.CARenewBefore - c.RenewBefore) / 4
	}
	if c.SkewTolerance == 0 {
		c.SkewTolerance = min(DefaultSkewTolerance, c.RenewBefore/4)
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = min(DefaultCheckInterval, c.Lifetime/10)
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	var errs []error
	if err := dynamiccert.ValidateHosts("Hosts", c.Hosts); err != nil {
		errs = append(errs, err)
	}
	switch {
	case c.Lifetime < 0 || c.CALifetime < 0:
		errs = append(errs, errors.New("lifetimes must be positive"))
	case c.Lifetime < MinLifetime:
		errs = append(errs, fmt.Errorf("lifetime %v must be at least %v: X.509 validity has one-second resolution, and a leaf is re-issued at most once per %v", c.Lifetime, MinLifetime, MinReissueInterval))
	case c.RenewBefore <= 0 || c.RenewBefore >= c.Lifetime:
		errs = append(errs, fmt.Errorf("renew-before %v must be positive and shorter than the lifetime %v", c.RenewBefore, c.Lifetime))
	case c.CARenewBefore <= c.RenewBefore || c.CARenewBefore >= c.CALifetime:
		errs = append(errs, fmt.Errorf("CA renew-before %v must be longer than the leaf renew-before %v and shorter than the CA lifetime %v", c.CARenewBefore, c.RenewBefore, c.CALifetime))
	case c.PropagationDelay < 0 || c.PropagationDelay >= c.CARenewBefore-c.RenewBefore:
		errs = append(errs, fmt.Errorf("propagation delay %v must be shorter than CA renew-before minus leaf renew-before (%v)", c.PropagationDelay, c.CARenewBefore-c.RenewBefore))
	case c.CARenewBefore-c.PropagationDelay < MinReissueInterval:
		// A successor signs no earlier than this before the old CA expires,
		// and the old CA caps the served leaf: the leaf re-issued after the
		// change may wait MinReissueInterval, and must come before that.
		errs = append(errs, fmt.Errorf("CA renew-before %v minus propagation delay %v must be at least %v, so the leaf re-issued when the successor CA signs is out before the old CA expires", c.CARenewBefore, c.PropagationDelay, MinReissueInterval))
	case c.SkewTolerance < 0 || c.SkewTolerance >= c.CALifetime:
		errs = append(errs, fmt.Errorf("skew tolerance %v must not be negative and must be shorter than the CA lifetime %v", c.SkewTolerance, c.CALifetime))
	case c.CheckInterval <= 0:
		errs = append(errs, fmt.Errorf("check interval %v must be positive", c.CheckInterval))
	}
	return errors.Join(errs...)
}

// SelfSigned makes a CA and a leaf signed by it in memory, and rotates both
// before they expire. It serves the leaf (CertKeyContentProvider,
// SNICertKeyContentProvider) and the bundle of every CA that is still valid
// (CAContentProvider), so a client that refreshes its bundle at any time
// keeps verifying the leaf through CA rotations.
//
// CA rotation is observed (see the package documentation): a successor CA
// joins the bundle, and signs only once PropagationDelay has passed and
// every Observer confirmed it. Rotation is checked against the injected
// clock's wall time at every deadline and at least every CheckInterval, so
// a machine that wakes from suspend or a clock that jumps renews at once,
// and never with a CA nobody has seen. All methods are safe for concurrent
// use.
type SelfSigned struct {
	*issuer
	cfg  SelfSignedConfig
	alts []dynamiccertificates.SNICertKeyContentProvider
}

var (
	_ dynamiccertificates.CertKeyContentProvider    = &SelfSigned{}
	_ dynamiccertificates.SNICertKeyContentProvider = &SelfSigned{}
	_ dynamiccertificates.CAContentProvider         = &SelfSigned{}
	_ dynamiccertificates.ControllerRunner          = &SelfSigned{}
)

// NewSelfSigned validates cfg, fills in its defaults and makes the first CA
// and leaf, so the provider serves as soon as it returns.
func NewSelfSigned(cfg SelfSignedConfig) (*SelfSigned, error) {
	if err := cfg.complete(); err != nil {
		return nil, fmt.Errorf("self-signed provider %q: %w", cfg.Name, err)
	}
	s := &SelfSigned{cfg: cfg, issuer: newIssuer(issuerConfig{
		name: cfg.Name, commonName: cfg.CommonName, hosts: cfg.Hosts, keyTypes: cfg.KeyTypes, lifetime: cfg.Lifetime,
		checkInterval: cfg.CheckInterval, clock: cfg.Clock, recorder: cfg.EventRecorder, eventObject: cfg.EventObject,
	}, rotation{
		name: cfg.Name, caKeyType: pki.KeyType(caKeyType(cfg.KeyTypes)),
		caLifetime: cfg.CALifetime, caRenewBefore: cfg.CARenewBefore,
		propagation: cfg.PropagationDelay, leafRenewBefore: cfg.RenewBefore,
		skew: cfg.SkewTolerance,
	}, &memoryStore{}, cfg.Observers)}
	s.alts = newAlternatives(s.issuer, cfg.SNINames)
	if _, err := s.check(context.Background()); err != nil {
		return nil, err
	}
	return s, nil
}

// Name returns the provider name.
func (s *SelfSigned) Name() string { return s.cfg.Name }

// Config returns the completed configuration, defaults filled in.
func (s *SelfSigned) Config() SelfSignedConfig { return s.cfg }

// SNINames returns the configured explicit SNI names, or nil.
func (s *SelfSigned) SNINames() []string { return s.cfg.SNINames }

// Alternatives returns one provider per key type after the first in
// KeyTypes (none by default), each serving the leaf of that type under the
// name "<Name>/<key type>", with the same SNINames. They need no Run of
// their own, and notify when the primary leaf does. The sni controller
// serves them next to the primary leaf on its own (see
// sni.AlternativesProvider); with upstream's controller, which cannot
// choose per client, add them as SNI certificates only if they should win
// their names over the primary. The slice is the caller's.
func (s *SelfSigned) Alternatives() []dynamiccertificates.SNICertKeyContentProvider {
	return slices.Clone(s.alts)
}

// AddObserver adds o to the observers a successor CA waits for. Add
// observers before the first rotation is due: a successor already waiting
// also waits for o from then on.
func (s *SelfSigned) AddObserver(o Observer) { s.addObserver(o) }

// Status returns where the CA rotation stands: the signing CA, a successor
// and the observers it still waits for, unsafe rotations, the last error.
func (s *SelfSigned) Status() RotationStatus { return s.currentStatus() }

// CurrentCertKeyContent returns the current leaf certificate and key PEM.
// Callers must not modify the returned slices.
func (s *SelfSigned) CurrentCertKeyContent() ([]byte, []byte) { return s.currentCertKey() }

// CurrentParsedCertKeyContent returns what CurrentCertKeyContent returns
// together with the leaf ready to serve. The sni controller serves it as
// is, without parsing the PEM. None of it may be modified.
func (s *SelfSigned) CurrentParsedCertKeyContent() ([]byte, []byte, *tls.Certificate) {
	return s.currentParsedCertKey()
}

// CurrentCABundleContent returns the PEM bundle of every CA that has not
// expired, including a successor that does not sign yet.
func (s *SelfSigned) CurrentCABundleContent() []byte { return s.currentBundle() }

// VerifyOptions returns options that verify against the current bundle.
func (s *SelfSigned) VerifyOptions() (x509.VerifyOptions, bool) { return s.verifyOptions() }

// Leaf returns the current leaf certificate.
func (s *SelfSigned) Leaf() *x509.Certificate { return s.currentLeaf() }

// RenewAt returns when the current leaf is due to be replaced.
func (s *SelfSigned) RenewAt() time.Time { return s.renewAt() }

// LastError returns the error of the last rotation attempt, or nil if it
// succeeded.
func (s *SelfSigned) LastError() error { return s.report.lastError() }

// RunOnce rotates whatever is due now.
func (s *SelfSigned) RunOnce(ctx context.Context) error {
	_, err := s.check(ctx)
	return err
}

// Run rotates certificates until ctx is done; workers is ignored: there is
// only ever one thing to do. A failed rotation is retried with backoff, and
// the current certificate keeps being served.
func (s *SelfSigned) Run(ctx context.Context, _ int) {
	logger := klog.FromContext(ctx).WithValues("provider", s.cfg.Name)
	logger.V(2).Info("Starting self-signed certificate rotation")
	defer logger.V(2).Info("Stopped self-signed certificate rotation")
	s.run(ctx)
}
