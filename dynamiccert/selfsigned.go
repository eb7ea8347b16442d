package dynamiccert

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/pki"
)

// Defaults for SelfSignedConfig.
const (
	// DefaultSelfSignedLifetime is the default lifetime of a self-signed leaf.
	DefaultSelfSignedLifetime = 30 * 24 * time.Hour
	// DefaultCheckInterval bounds how long the provider goes without looking
	// at the wall clock, so a suspended machine or a clock jump renews
	// promptly even though timers were asleep.
	DefaultCheckInterval = time.Minute
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
	// Hosts are the DNS names and IP addresses the leaf is valid for.
	// Default DefaultSelfSignedHosts.
	Hosts []string
	// SNINames, when set, replace the names taken from the certificate for
	// SNI selection (see sni). Default nil.
	SNINames []string
	// KeyType of the CA and leaf keys. Default pki.ECDSAP256.
	KeyType pki.KeyType
	// Lifetime of the leaf. Default DefaultSelfSignedLifetime.
	Lifetime time.Duration
	// RenewBefore is how long before the leaf expires it is replaced.
	// Default Lifetime/3.
	RenewBefore time.Duration
	// CALifetime is the lifetime of each CA. Default 3*Lifetime.
	CALifetime time.Duration
	// CARenewBefore is how long before the signing CA expires its successor
	// is made and joins the CA bundle. Default CALifetime/3. It must exceed
	// RenewBefore, so a leaf is never signed by a CA about to expire.
	CARenewBefore time.Duration
	// PropagationDelay is how long a new CA sits in the bundle before it
	// signs leaves, so clients that refresh their bundle in that window
	// never see a leaf they cannot verify. Default (CARenewBefore-RenewBefore)/2.
	PropagationDelay time.Duration
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
	if c.KeyType == "" {
		c.KeyType = pki.ECDSAP256
	}
	if _, err := pki.ParseKeyType(string(c.KeyType)); err != nil {
		return err
	}
	if c.Lifetime == 0 {
		c.Lifetime = DefaultSelfSignedLifetime
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
		c.PropagationDelay = (c.CARenewBefore - c.RenewBefore) / 2
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = min(DefaultCheckInterval, c.Lifetime/10)
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	var errs []error
	switch {
	case c.Lifetime < 0 || c.CALifetime < 0:
		errs = append(errs, errors.New("lifetimes must be positive"))
	case c.RenewBefore <= 0 || c.RenewBefore >= c.Lifetime:
		errs = append(errs, fmt.Errorf("renew-before %v must be positive and shorter than the lifetime %v", c.RenewBefore, c.Lifetime))
	case c.CARenewBefore <= c.RenewBefore || c.CARenewBefore >= c.CALifetime:
		errs = append(errs, fmt.Errorf("CA renew-before %v must be longer than the leaf renew-before %v and shorter than the CA lifetime %v", c.CARenewBefore, c.RenewBefore, c.CALifetime))
	case c.PropagationDelay < 0 || c.PropagationDelay >= c.CARenewBefore-c.RenewBefore:
		errs = append(errs, fmt.Errorf("propagation delay %v must be shorter than CA renew-before minus leaf renew-before (%v)", c.PropagationDelay, c.CARenewBefore-c.RenewBefore))
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
// Rotation is checked against the injected clock's wall time at every
// deadline and at least every CheckInterval, so a machine that wakes from
// suspend or a clock that jumps renews at once. All methods are safe for
// concurrent use.
type SelfSigned struct {
	listeners
	cfg      SelfSignedConfig
	sched    rotation
	dnsNames []string
	ips      []net.IP

	mu      sync.RWMutex
	cas     caSet
	leaf    *pki.Issued
	leafCA  []byte // raw certificate of the CA that signed leaf
	bundle  []byte
	pool    *x509.CertPool
	lastErr error
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
	s := &SelfSigned{cfg: cfg, sched: rotation{
		name: cfg.Name, keyType: cfg.KeyType,
		caLifetime: cfg.CALifetime, caRenewBefore: cfg.CARenewBefore,
		propagation: cfg.PropagationDelay, leafRenewBefore: cfg.RenewBefore,
	}}
	for _, h := range cfg.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			s.ips = append(s.ips, ip)
		} else {
			s.dnsNames = append(s.dnsNames, h)
		}
	}
	if _, err := s.check(); err != nil {
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

// CurrentCertKeyContent returns the current leaf certificate and key PEM.
// Callers must not modify the returned slices.
func (s *SelfSigned) CurrentCertKeyContent() ([]byte, []byte) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.leaf.CertPEM, s.leaf.KeyPEM
}

// CurrentCABundleContent returns the PEM bundle of every CA that has not
// expired, including a successor that does not sign yet.
func (s *SelfSigned) CurrentCABundleContent() []byte {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.bundle
}

// VerifyOptions returns options that verify against the current bundle.
func (s *SelfSigned) VerifyOptions() (x509.VerifyOptions, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return clientVerifyOptions(s.pool), true
}

// Leaf returns the current leaf certificate.
func (s *SelfSigned) Leaf() *x509.Certificate {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.leaf.Cert
}

// RenewAt returns when the current leaf is due to be replaced.
func (s *SelfSigned) RenewAt() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.leaf.Cert.NotAfter.Add(-s.cfg.RenewBefore)
}

// LastError returns the error of the last rotation attempt, or nil if it
// succeeded.
func (s *SelfSigned) LastError() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lastErr
}

// RunOnce rotates whatever is due now. Tests driving a fake clock call it
// after each step to rotate synchronously.
func (s *SelfSigned) RunOnce(context.Context) error {
	_, err := s.check()
	return err
}

// Run rotates certificates until ctx is done. workers is ignored: there is
// only ever one thing to do.
func (s *SelfSigned) Run(ctx context.Context, _ int) {
	logger := klog.FromContext(ctx).WithValues("provider", s.cfg.Name)
	logger.V(2).Info("Starting self-signed certificate rotation")
	defer logger.V(2).Info("Stopped self-signed certificate rotation")
	retry := newIssuerRetry()
	for {
		next, err := s.check()
		// Generation only fails on an exhausted entropy source or a bug;
		// retry with backoff, still serving the current certificate.
		wait, _ := retry.after(next, err, s.cfg.CheckInterval)
		t := s.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// check rotates what is due at the clock's current time and returns how long
// until the next deadline.
func (s *SelfSigned) check() (time.Duration, error) {
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	changed, err := s.rotateLocked(now)
	if err != nil {
		err = fmt.Errorf("self-signed provider %q: %w", s.cfg.Name, err)
		if s.lastErr == nil || s.lastErr.Error() != err.Error() {
			klog.ErrorS(err, "Rotation failed; serving the current certificate", "provider", s.cfg.Name)
		}
		certmetrics.LoadError(s.cfg.Name)
	}
	s.lastErr = err
	next := s.nextDeadlineLocked().Sub(now)
	s.mu.Unlock()
	if changed {
		s.notify()
	}
	return next, err
}

// rotateLocked applies the shared rotation schedule (see rotation.advance
// and rotation.leafDue) to the in-memory state.
func (s *SelfSigned) rotateLocked(now time.Time) (bool, error) {
	changed, err := s.sched.advance(&s.cas, now)
	if err != nil {
		return false, err
	}
	if changed {
		s.bundle, s.pool = s.cas.bundlePEM()
	}
	if !s.sched.leafDue(s.leaf, s.leafCA, &s.cas, now) {
		return changed, nil
	}
	issued, err := s.sched.issueLeaf(&s.cas, s.cfg.CommonName, s.dnsNames, s.ips, s.cfg.Lifetime, now)
	if err != nil {
		return changed, err
	}
	s.leaf, s.leafCA = issued, s.cas.signing.Cert.Raw
	certmetrics.CertificateLoaded(s.cfg.Name, serial(issued.Cert), issued.Cert.NotAfter)
	klog.V(2).InfoS("Issued self-signed serving certificate", "provider", s.cfg.Name,
		"subject", issued.Cert.Subject.CommonName, "names", s.cfg.Hosts,
		"serial", serial(issued.Cert), "notAfter", issued.Cert.NotAfter)
	return true, nil
}

func (s *SelfSigned) nextDeadlineLocked() time.Time {
	return s.sched.nextDeadline(&s.cas, s.leaf.Cert)
}
