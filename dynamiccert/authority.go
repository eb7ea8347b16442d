package dynamiccert

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/pki"
)

// Keys and annotations the Authority keeps in its CA Secret besides the
// kubernetes.io/tls keys (tls.crt/tls.key: the signing CA) and ca.crt (the
// bundle of every CA still valid).
const (
	// AuthorityNextCertKey and AuthorityNextKeyKey hold a successor CA that
	// is already in ca.crt but does not sign yet.
	AuthorityNextCertKey = "next.crt"
	AuthorityNextKeyKey  = "next.key"
	// AuthorityNextSinceAnnotation records when the successor joined ca.crt
	// (RFC 3339), so every replica agrees when it starts signing.
	AuthorityNextSinceAnnotation = "evercert.io/next-ca-published-at"
)

// AuthorityConfig configures an Authority.
type AuthorityConfig struct {
	// Name identifies the provider in logs and metrics. Default
	// "authority:<Namespace>/<SecretName>".
	Name string
	// Namespace and SecretName name the CA Secret. Required.
	Namespace, SecretName string
	// Client reads and writes the Secret. Required. RBAC: get, list, watch,
	// update on the Secret (resourceNames can limit these) and create on
	// secrets in the namespace unless DisableCreate.
	Client kubernetes.Interface
	// DisableCreate makes the Authority wait for a pre-created Secret
	// instead of creating it. It says so once in the log, then waits quietly.
	DisableCreate bool
	// Hosts are the DNS names and IPs of the serving leaf. Required.
	Hosts []string
	// CommonName of the leaf. Default the first DNS name in Hosts.
	CommonName string
	// SNINames, when set, replace the leaf's names for SNI selection.
	SNINames []string
	// KeyType of CA and leaf keys. Default pki.ECDSAP256.
	KeyType pki.KeyType
	// Lifetime and RenewBefore of the leaf. Default 7 days and Lifetime/3.
	Lifetime, RenewBefore time.Duration
	// CALifetime and CARenewBefore of each CA. Default 8*Lifetime and
	// CALifetime/3. CARenewBefore must exceed RenewBefore plus
	// PropagationDelay.
	CALifetime, CARenewBefore time.Duration
	// PropagationDelay is how long a new CA is in ca.crt before it signs, so
	// every client (and caBundle) has it first. Default
	// (CARenewBefore-RenewBefore)/2.
	PropagationDelay time.Duration
	// CheckInterval bounds the time between wall-clock checks. Default one
	// minute, or Lifetime/10 when shorter.
	CheckInterval time.Duration
	// Clock drives rotation and validity. Default clock.RealClock{}.
	Clock clock.WithTicker
}

func (c *AuthorityConfig) complete() error {
	switch {
	case c.Namespace == "" || c.SecretName == "":
		return errors.New("namespace and name of the CA secret are required")
	case c.Client == nil:
		return errors.New("a client is required")
	case len(c.Hosts) == 0:
		return errors.New("at least one host is required")
	}
	if c.Name == "" {
		c.Name = "authority:" + c.Namespace + "/" + c.SecretName
	}
	if c.Lifetime == 0 {
		c.Lifetime = 7 * 24 * time.Hour
	}
	if c.CALifetime == 0 {
		c.CALifetime = 8 * c.Lifetime
	}
	// The rotation schedule is the self-signed provider's; reuse its
	// defaults and checks so the two never drift apart.
	ss := SelfSignedConfig{
		Name: c.Name, CommonName: c.CommonName, Hosts: c.Hosts, KeyType: c.KeyType,
		Lifetime: c.Lifetime, RenewBefore: c.RenewBefore, CALifetime: c.CALifetime,
		CARenewBefore: c.CARenewBefore, PropagationDelay: c.PropagationDelay,
		CheckInterval: c.CheckInterval, Clock: c.Clock,
	}
	if err := ss.complete(); err != nil {
		return err
	}
	c.CommonName, c.KeyType, c.RenewBefore, c.CARenewBefore = ss.CommonName, ss.KeyType, ss.RenewBefore, ss.CARenewBefore
	c.PropagationDelay, c.CheckInterval, c.Clock = ss.PropagationDelay, ss.CheckInterval, ss.Clock
	return nil
}

// Authority keeps a CA in a Kubernetes Secret, shared by every replica, and
// serves a leaf each replica makes in memory, signed by that CA. The CA key
// never leaves the Secret and the processes that use it; leaf keys never
// leave their process.
//
// CA rotation overlaps: a successor CA first joins ca.crt, signs only
// PropagationDelay later, and the old CA stays in ca.crt until it expires.
// Replicas converge with optimistic concurrency (resourceVersion): a write
// conflict means re-read and recompute, not an error, and because every
// decision is a pure function of the Secret and the clock, replicas do not
// undo each other's writes.
//
// Authority implements dynamiccertificates.SNICertKeyContentProvider (the
// leaf), CAContentProvider (ca.crt) and ControllerRunner. It is safe for
// concurrent use.
type Authority struct {
	listeners
	cfg    AuthorityConfig
	sched  rotation
	src    *secretSource
	report *reporter
	ips    []net.IP
	dns    []string

	mu       sync.RWMutex
	bundle   []byte
	caOpts   x509.VerifyOptions
	leaf     *pki.Issued
	leafCA   []byte // raw certificate of the CA that signed leaf
	waitLogd bool

	kick chan struct{}
}

var (
	_ dynamiccertificates.SNICertKeyContentProvider = &Authority{}
	_ dynamiccertificates.CAContentProvider         = &Authority{}
	_ dynamiccertificates.ControllerRunner          = &Authority{}
)

// NewAuthority validates cfg. The Authority has no content until RunOnce or
// Run has read (or created) the Secret.
func NewAuthority(cfg AuthorityConfig) (*Authority, error) {
	if err := cfg.complete(); err != nil {
		return nil, fmt.Errorf("authority %s/%s: %w", cfg.Namespace, cfg.SecretName, err)
	}
	a := &Authority{cfg: cfg, kick: make(chan struct{}, 1), sched: rotation{
		name: cfg.Name, keyType: cfg.KeyType,
		caLifetime: cfg.CALifetime, caRenewBefore: cfg.CARenewBefore,
		propagation: cfg.PropagationDelay, leafRenewBefore: cfg.RenewBefore,
	}}
	for _, h := range cfg.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			a.ips = append(a.ips, ip)
		} else {
			a.dns = append(a.dns, h)
		}
	}
	src, err := newSecretSource(SecretConfig{
		Name: cfg.Name, Namespace: cfg.Namespace, SecretName: cfg.SecretName,
		Client: cfg.Client, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, err
	}
	// Reconcile errors and watch errors are reported apart: each stream
	// logs its distinct errors once. Sharing one reporter would make the
	// two messages alternate, and every alternation is logged again.
	a.report = &reporter{name: cfg.Name}
	src.process = func(*corev1.Secret) error {
		src.report.succeeded() // an event arrived: the watch works
		a.Enqueue()
		return nil
	}
	a.src = src
	return a, nil
}

// Name returns the provider name.
func (a *Authority) Name() string { return a.cfg.Name }

// SNINames returns the explicit SNI names, or nil.
func (a *Authority) SNINames() []string { return a.cfg.SNINames }

// CurrentCertKeyContent returns this replica's leaf, or nil, nil before the
// CA is known.
func (a *Authority) CurrentCertKeyContent() ([]byte, []byte) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.leaf == nil {
		return nil, nil
	}
	return a.leaf.CertPEM, a.leaf.KeyPEM
}

// CurrentCABundleContent returns ca.crt as last read from the Secret: every
// CA that is still valid, including a successor that does not sign yet.
func (a *Authority) CurrentCABundleContent() []byte {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.bundle
}

// VerifyOptions verifies against the bundle; ok is false before it is known.
func (a *Authority) VerifyOptions() (x509.VerifyOptions, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.caOpts, a.bundle != nil
}

// Leaf returns this replica's leaf certificate, or nil.
func (a *Authority) Leaf() *x509.Certificate {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.leaf == nil {
		return nil
	}
	return a.leaf.Cert
}

// RenewAt returns when the leaf is due to be replaced (zero before the
// first leaf).
func (a *Authority) RenewAt() time.Time {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.leaf == nil {
		return time.Time{}
	}
	return a.leaf.Cert.NotAfter.Add(-a.cfg.RenewBefore)
}

// LastError returns the last reconcile error, nil after a successful
// reconcile. Watch errors are logged (each distinct one once) and counted,
// but decisions rest on the reconcile's own GET.
func (a *Authority) LastError() error { return a.report.lastError() }

// Enqueue asks the run loop to reconcile soon. Requests coalesce.
func (a *Authority) Enqueue() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// RunOnce reads the Secret with a GET, creates or rotates the CA if due,
// and makes this replica's leaf. Tests with a fake clock call it after each
// step to rotate synchronously.
func (a *Authority) RunOnce(ctx context.Context) error {
	_, err := a.reconcile(ctx)
	return err
}

// Run follows the Secret and rotates until ctx is done. workers is ignored.
//
// A failed reconcile is retried with backoff (internal/backoff: exponential,
// jittered, capped, at least a 429's Retry-After) on the configured clock.
// While it backs off, watch events wait for the backoff to end, so a chatty
// watch cannot turn the retries into a hot loop; when healthy, an event
// reconciles at once.
func (a *Authority) Run(ctx context.Context, _ int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	// The watch only kicks the loop; reconcile reads with a GET so that it
	// always decides on the newest resourceVersion.
	wg.Go(func() { a.src.run(ctx) })
	retry := newIssuerRetry()
	for {
		// The GET below covers every event so far.
		select {
		case <-a.kick:
		default:
		}
		next, err := a.reconcile(ctx)
		if ctx.Err() != nil {
			return
		}
		wait, backingOff := retry.after(next, err, a.cfg.CheckInterval)
		kick := a.kick
		if backingOff {
			kick = nil // an event is served when the backoff ends
			if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
				klog.V(2).InfoS("CA secret keeps changing underneath us; backing off", "provider", a.cfg.Name, "retryIn", wait)
			}
		}
		t := a.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-kick:
			t.Stop()
		case <-t.C():
		}
	}
}

// issuerRetry decides how long a rotation loop (Authority.Run,
// SelfSigned.Run) sleeps after a pass: until the next deadline, at most the
// check interval, after a success; the next backoff delay after a failure.
// It is owned by one loop.
type issuerRetry struct {
	backoff *backoff.Backoff
}

func newIssuerRetry() *issuerRetry {
	return &issuerRetry{backoff: backoff.New(backoff.DefaultInitial, backoff.DefaultCap)}
}

// after returns the wait after a pass that ended with err and, on success,
// next until its next deadline. backingOff reports a failure: the wait is a
// backoff delay, which neither the check interval nor an event may shorten.
func (r *issuerRetry) after(next time.Duration, err error, checkInterval time.Duration) (wait time.Duration, backingOff bool) {
	if err != nil {
		return r.backoff.Next(err), true
	}
	r.backoff.Reset()
	return min(max(next, 0), checkInterval), false
}

// reconcile brings the Secret and this replica's leaf up to date, and
// returns the time until the next deadline.
func (a *Authority) reconcile(ctx context.Context) (time.Duration, error) {
	const attempts = 5
	var err error
	for range attempts {
		var next time.Duration
		next, err = a.reconcileOnce(ctx)
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			return next, err
		}
		// Another replica wrote first: re-read and decide again.
		klog.V(2).InfoS("CA secret changed underneath us; re-reading", "provider", a.cfg.Name)
	}
	return 0, err
}

func (a *Authority) reconcileOnce(ctx context.Context) (time.Duration, error) {
	secrets := a.cfg.Client.CoreV1().Secrets(a.cfg.Namespace)
	secret, err := secrets.Get(ctx, a.cfg.SecretName, metav1.GetOptions{})
	exists := err == nil
	switch {
	case apierrors.IsNotFound(err) && a.cfg.DisableCreate:
		a.mu.Lock()
		first := !a.waitLogd
		a.waitLogd = true
		a.mu.Unlock()
		if first {
			klog.InfoS("Waiting for the CA secret to be created", "provider", a.cfg.Name, "secret", a.src.key)
		}
		return a.cfg.CheckInterval, nil
	case apierrors.IsNotFound(err):
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: a.cfg.Namespace, Name: a.cfg.SecretName},
			Type:       corev1.SecretTypeTLS,
		}
	case err != nil && ctx.Err() != nil:
		// Shutting down: not a failure of the Secret.
		return 0, ctx.Err()
	case err != nil:
		return 0, a.report.failed(fmt.Errorf("reading CA secret %s: %w", a.src.key, describeAPIError(err)))
	}

	now := a.cfg.Clock.Now()
	state, err := parseAuthoritySecret(secret)
	if err != nil {
		return 0, a.report.failed(fmt.Errorf("CA secret %s: %w", a.src.key, err))
	}
	changed, err := a.sched.advance(state, now)
	if err != nil {
		return 0, a.report.failed(fmt.Errorf("CA secret %s: %w", a.src.key, err))
	}
	if changed {
		updated := secret.DeepCopy()
		writeAuthoritySecret(state, updated)
		if !exists {
			secret, err = secrets.Create(ctx, updated, metav1.CreateOptions{})
		} else {
			secret, err = secrets.Update(ctx, updated, metav1.UpdateOptions{})
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			return 0, err
		}
		if err != nil && ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err != nil {
			return 0, a.report.failed(fmt.Errorf("writing CA secret %s: %w", a.src.key, describeAPIError(err)))
		}
		klog.V(2).InfoS("Wrote CA secret", "provider", a.cfg.Name, "secret", a.src.key, "resourceVersion", secret.ResourceVersion,
			"signingSerial", state.signing.Cert.SerialNumber.Text(16), "bundleSize", len(state.bundle))
	}
	if err := a.apply(state, now); err != nil {
		return 0, a.report.failed(fmt.Errorf("CA secret %s: %w", a.src.key, err))
	}
	a.report.succeeded()
	return a.nextDeadline(state).Sub(now), nil
}

// parseAuthoritySecret reads the CA side of the rotation state from the
// Secret; an empty Secret is an empty state.
func parseAuthoritySecret(s *corev1.Secret) (*caSet, error) {
	st := &caSet{}
	var err error
	if len(s.Data[corev1.TLSCertKey]) > 0 || len(s.Data[corev1.TLSPrivateKeyKey]) > 0 {
		if st.signing, err = parseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
			return nil, fmt.Errorf("signing CA (%s, %s): %w", corev1.TLSCertKey, corev1.TLSPrivateKeyKey, err)
		}
	}
	if len(s.Data[AuthorityNextCertKey]) > 0 {
		if st.next, err = parseCA(s.Data[AuthorityNextCertKey], s.Data[AuthorityNextKeyKey]); err != nil {
			return nil, fmt.Errorf("successor CA (%s, %s): %w", AuthorityNextCertKey, AuthorityNextKeyKey, err)
		}
		if st.nextSince, err = time.Parse(time.RFC3339, s.Annotations[AuthorityNextSinceAnnotation]); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", AuthorityNextSinceAnnotation, err)
		}
	}
	if len(s.Data[SecretCAKey]) > 0 {
		if st.bundle, err = pki.ParseCABundle(s.Data[SecretCAKey]); err != nil {
			return nil, fmt.Errorf("%s: %w", SecretCAKey, err)
		}
	}
	return st, nil
}

func parseCA(certPEM, keyPEM []byte) (*pki.Issued, error) {
	pair, err := pki.ParseCertKey(certPEM, keyPEM, zeroTime)
	if err != nil {
		return nil, err
	}
	if !pair.Leaf.IsCA {
		return nil, errors.New("certificate is not a CA")
	}
	signer, ok := pair.TLS.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported private key type %T", pair.TLS.PrivateKey)
	}
	return &pki.Issued{Cert: pair.Leaf, Key: signer, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// writeAuthoritySecret stores the state in the Secret: the signing CA as tls.crt and
// tls.key, the bundle as ca.crt, and a successor with its publication time.
func writeAuthoritySecret(st *caSet, s *corev1.Secret) {
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[corev1.TLSCertKey] = st.signing.CertPEM
	s.Data[corev1.TLSPrivateKeyKey] = st.signing.KeyPEM
	s.Data[SecretCAKey], _ = st.bundlePEM()
	if st.next != nil {
		s.Data[AuthorityNextCertKey] = st.next.CertPEM
		s.Data[AuthorityNextKeyKey] = st.next.KeyPEM
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[AuthorityNextSinceAnnotation] = st.nextSince.UTC().Format(time.RFC3339)
	} else {
		delete(s.Data, AuthorityNextCertKey)
		delete(s.Data, AuthorityNextKeyKey)
		delete(s.Annotations, AuthorityNextSinceAnnotation)
	}
}

// apply adopts st locally: the bundle, and a leaf re-signed when the
// schedule says so.
func (a *Authority) apply(st *caSet, now time.Time) error {
	bundle, pool := st.bundlePEM()
	a.mu.Lock()
	changed := !bytes.Equal(bundle, a.bundle)
	if changed {
		a.bundle, a.caOpts = bundle, clientVerifyOptions(pool)
	}
	prev := a.leaf
	if a.sched.leafDue(prev, a.leafCA, st, now) {
		issued, err := a.sched.issueLeaf(st, a.cfg.CommonName, a.dns, a.ips, a.cfg.Lifetime, now)
		if err != nil {
			a.mu.Unlock()
			return err
		}
		a.leaf, a.leafCA, changed = issued, st.signing.Cert.Raw, true
		certmetrics.CertificateLoaded(a.cfg.Name, serial(issued.Cert), issued.Cert.NotAfter)
		klog.V(2).InfoS("Issued serving certificate", "provider", a.cfg.Name, "subject", issued.Cert.Subject.CommonName,
			"names", a.cfg.Hosts, "serial", serial(issued.Cert), "notAfter", issued.Cert.NotAfter,
			"caSerial", serial(st.signing.Cert))
	}
	a.mu.Unlock()
	if changed {
		a.notify()
	}
	return nil
}

func (a *Authority) nextDeadline(st *caSet) time.Time {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.sched.nextDeadline(st, a.leaf.Cert)
}
