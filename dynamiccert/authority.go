package dynamiccert

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

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
	a := &Authority{cfg: cfg, kick: make(chan struct{}, 1)}
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
	a.report = src.report
	src.process = func(*corev1.Secret) error {
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

// LastError returns the last error, nil after a successful reconcile.
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
func (a *Authority) Run(ctx context.Context, _ int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	// The watch only kicks the loop; reconcile reads with a GET so that it
	// always decides on the newest resourceVersion.
	wg.Go(func() { a.src.run(ctx) })
	for {
		wait, err := a.reconcile(ctx)
		if err != nil {
			wait = min(wait, time.Second)
		}
		t := a.cfg.Clock.NewTimer(min(max(wait, 0), a.cfg.CheckInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.kick:
			t.Stop()
		case <-t.C():
		}
	}
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
	case err != nil:
		return 0, a.report.failed(fmt.Errorf("reading CA secret %s: %w", a.src.key, describeAPIError(err)))
	}

	now := a.cfg.Clock.Now()
	state, err := parseAuthoritySecret(secret)
	if err != nil {
		return 0, a.report.failed(fmt.Errorf("CA secret %s: %w", a.src.key, err))
	}
	changed, err := a.rotate(state, now)
	if err != nil {
		return 0, a.report.failed(fmt.Errorf("CA secret %s: %w", a.src.key, err))
	}
	if changed {
		updated := secret.DeepCopy()
		state.writeTo(updated)
		if !exists {
			secret, err = secrets.Create(ctx, updated, metav1.CreateOptions{})
		} else {
			secret, err = secrets.Update(ctx, updated, metav1.UpdateOptions{})
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			return 0, err
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

// authorityState is the CA Secret's content, parsed.
type authorityState struct {
	signing   *pki.Issued
	next      *pki.Issued
	nextSince time.Time
	bundle    []*x509.Certificate
}

func parseAuthoritySecret(s *corev1.Secret) (*authorityState, error) {
	st := &authorityState{}
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

func (st *authorityState) writeTo(s *corev1.Secret) {
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[corev1.TLSCertKey] = st.signing.CertPEM
	s.Data[corev1.TLSPrivateKeyKey] = st.signing.KeyPEM
	var b bytes.Buffer
	for _, c := range st.bundle {
		b.Write(pki.EncodeCertPEM(c.Raw))
	}
	s.Data[SecretCAKey] = b.Bytes()
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

// rotate applies the CA schedule to st at now and reports whether st
// changed. The schedule is SelfSigned's: a successor joins the bundle
// CARenewBefore ahead of expiry, signs PropagationDelay later (at once when
// the signing CA is within RenewBefore of expiry), expired CAs leave the
// bundle, and a missing, expired or future-dated signing CA is replaced at once.
func (a *Authority) rotate(st *authorityState, now time.Time) (bool, error) {
	changed := false
	newCA := func() (*pki.Issued, error) {
		return pki.NewCA(pki.Request{CommonName: a.cfg.Name + "-ca", KeyType: a.cfg.KeyType, Now: now, Lifetime: a.cfg.CALifetime})
	}
	inBundle := func(c *x509.Certificate) bool {
		return slices.ContainsFunc(st.bundle, func(b *x509.Certificate) bool { return b.Equal(c) })
	}
	if st.signing != nil && !validAt(st.signing, now) && st.next != nil && validAt(st.next, now) {
		// Every replica slept through the propagation delay: the successor
		// is already in ca.crt, so it signs now rather than an unknown CA.
		st.signing, st.next, changed = st.next, nil, true
	}
	if st.signing == nil || !validAt(st.signing, now) {
		ca, err := newCA()
		if err != nil {
			return false, fmt.Errorf("making CA: %w", err)
		}
		st.signing, st.next, changed = ca, nil, true
		klog.InfoS("Created signing CA", "provider", a.cfg.Name, "serial", ca.Cert.SerialNumber.Text(16), "notAfter", ca.Cert.NotAfter)
	} else if !now.Before(st.signing.Cert.NotAfter.Add(-a.cfg.CARenewBefore)) {
		if st.next == nil {
			ca, err := newCA()
			if err != nil {
				return false, fmt.Errorf("making successor CA: %w", err)
			}
			st.next, st.nextSince, changed = ca, now, true
			klog.InfoS("Published successor CA", "provider", a.cfg.Name, "serial", ca.Cert.SerialNumber.Text(16), "signsAfter", now.Add(a.cfg.PropagationDelay))
		}
		if !now.Before(st.nextSince.Add(a.cfg.PropagationDelay)) || !now.Before(st.signing.Cert.NotAfter.Add(-a.cfg.RenewBefore)) {
			st.signing, st.next, changed = st.next, nil, true
			klog.InfoS("Successor CA now signs", "provider", a.cfg.Name, "serial", st.signing.Cert.SerialNumber.Text(16))
		}
	}
	for _, c := range []*pki.Issued{st.signing, st.next} {
		if c != nil && !inBundle(c.Cert) {
			st.bundle, changed = append(st.bundle, c.Cert), true
		}
	}
	kept := slices.DeleteFunc(slices.Clone(st.bundle), func(c *x509.Certificate) bool { return !now.Before(c.NotAfter) })
	if len(kept) != len(st.bundle) {
		st.bundle, changed = kept, true
	}
	return changed, nil
}

// apply adopts st locally: the bundle, and a leaf re-signed when the CA
// changed or the leaf is due.
func (a *Authority) apply(st *authorityState, now time.Time) error {
	var b bytes.Buffer
	pool := x509.NewCertPool()
	for _, c := range st.bundle {
		b.Write(pki.EncodeCertPEM(c.Raw))
		pool.AddCert(c)
	}
	a.mu.Lock()
	changed := !bytes.Equal(b.Bytes(), a.bundle)
	if changed {
		a.bundle, a.caOpts = b.Bytes(), clientVerifyOptions(pool)
	}
	leaf := a.leaf
	// A leaf capped at its CA's expiry cannot get longer by re-signing with
	// the same CA; only a CA change renews it, so this never spins.
	due := leaf != nil && !now.Before(leaf.Cert.NotAfter.Add(-a.cfg.RenewBefore)) && leaf.Cert.NotAfter.Before(st.signing.Cert.NotAfter)
	if leaf == nil || !bytes.Equal(a.leafCA, st.signing.Cert.Raw) || due || now.Before(leaf.Cert.NotBefore) {
		issued, err := pki.IssueLeaf(st.signing, pki.Request{
			CommonName: a.cfg.CommonName, DNSNames: a.dns, IPs: a.ips,
			KeyType: a.cfg.KeyType, Now: now, Lifetime: a.cfg.Lifetime,
		})
		if err != nil {
			a.mu.Unlock()
			return fmt.Errorf("issuing leaf: %w", err)
		}
		a.leaf, a.leafCA, changed = issued, st.signing.Cert.Raw, true
		certmetrics.CertificateLoaded(a.cfg.Name, issued.Cert.SerialNumber.Text(16), issued.Cert.NotAfter)
		klog.V(2).InfoS("Issued serving certificate", "provider", a.cfg.Name, "subject", issued.Cert.Subject.CommonName,
			"names", a.cfg.Hosts, "serial", issued.Cert.SerialNumber.Text(16), "notAfter", issued.Cert.NotAfter,
			"caSerial", st.signing.Cert.SerialNumber.Text(16))
	}
	a.mu.Unlock()
	if changed {
		a.notify()
	}
	return nil
}

func (a *Authority) nextDeadline(st *authorityState) time.Time {
	a.mu.RLock()
	leafEnd := a.leaf.Cert.NotAfter
	a.mu.RUnlock()
	next := st.signing.Cert.NotAfter
	if leafEnd.Before(next) {
		// Not capped by its CA, so the leaf renews on its own schedule.
		next = leafEnd.Add(-a.cfg.RenewBefore)
	}
	if st.next == nil {
		next = earliest(next, st.signing.Cert.NotAfter.Add(-a.cfg.CARenewBefore))
	} else {
		next = earliest(next, st.nextSince.Add(a.cfg.PropagationDelay))
	}
	for _, c := range st.bundle {
		next = earliest(next, c.NotAfter)
	}
	return next
}
