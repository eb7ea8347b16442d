package dynamiccert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/secretwatch"
)

// SecretCAKey is the Secret key holding a CA bundle, as in
// kubernetes.io/service-account-token and cert-manager Secrets.
const SecretCAKey = "ca.crt"

// DefaultSecretResync is how often a Secret source re-reads its Secret from
// the API server even without a watch event.
const DefaultSecretResync = 10 * time.Minute

// SecretConfig configures a Secret source.
type SecretConfig struct {
	// Name identifies the provider in logs and metrics. Default
	// "secret:<Namespace>/<SecretName>".
	Name string
	// Namespace and SecretName name the Secret. Both are required.
	Namespace, SecretName string
	// Client reads the Secret. Required. Only get, list and watch on this
	// one Secret are needed: the watch carries a field selector on
	// metadata.name, so RBAC can be limited with resourceNames.
	Client kubernetes.Interface
	// SNINames, when set, replace the names taken from the certificate for
	// SNI selection. Certificate sources only.
	SNINames []string
	// Resync is how often the Secret is re-read from the API server (a GET)
	// even without a watch event: content that differs from what is served
	// is loaded, so a watch that stays open but delivers nothing (a wedged
	// cache, a proxy) delays a change by Resync at most. A failed re-read
	// is reported and retried with backoff (at most Resync apart). Default
	// DefaultSecretResync. Ignored by authority.New, whose checks bound the
	// age of the watch's cache instead (see authority.Config.CheckInterval).
	Resync time.Duration
	// Clock is used for validity checks of loaded certificates and for
	// Resync. Default clock.RealClock{}.
	Clock clock.WithTicker
	// EventRecorder receives a Normal CertificateRotated Event for every new
	// certificate (certificate sources) and a Warning CertificateLoadFailed
	// Event for every distinct load failure, about EventObject. Optional.
	EventRecorder events.EventRecorder
	// EventObject is the object the Events are about. Default the Secret.
	EventObject runtime.Object
}

// secretSource is what SecretCertKey and SecretCA share: a watch on one
// Secret, once-per-distinct-error reporting, and the run loop
// (internal/secretwatch, which the Authority shares too), with the config
// and reporter the providers use.
type secretSource struct {
	*secretwatch.Source
	cfg    SecretConfig
	key    string // namespace/name, for messages
	report *reporter
}

func newSecretSource(cfg SecretConfig) (*secretSource, error) {
	if cfg.Resync == 0 {
		cfg.Resync = DefaultSecretResync
	}
	w, err := secretwatch.New(secretwatch.Config{
		Name: cfg.Name, Namespace: cfg.Namespace, SecretName: cfg.SecretName, Client: cfg.Client,
		Resync: cfg.Resync, Clock: cfg.Clock, EventRecorder: cfg.EventRecorder, EventObject: cfg.EventObject,
	})
	if err != nil {
		return nil, err
	}
	cfg.Name, cfg.Clock, cfg.EventObject = w.Config.Name, w.Config.Clock, w.Config.EventObject
	return &secretSource{Source: w, cfg: cfg, key: w.Key, report: &reporter{w.Report}}, nil
}

// secretData returns the named keys of secret, or an error listing those
// missing or empty.
func secretData(secret *corev1.Secret, keys ...string) ([][]byte, error) {
	var missing []string
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = secret.Data[k]
		if len(out[i]) == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("missing or empty keys %v", missing)
	}
	return out, nil
}

// SecretCertKey serves the tls.crt and tls.key of one Kubernetes Secret and
// follows changes through a watch: a write to the Secret is served within
// the watch latency (well under a second), with no kubelet volume refresh in
// between and no API call during a handshake. It also re-reads the Secret
// every SecretConfig.Resync, so a watch that stays open but delivers
// nothing delays a change by Resync at most.
//
// Content that is missing, malformed, mismatched, expired or not yet valid,
// a deleted Secret, a forbidden or unreachable API server: each is an error
// naming namespace/name, counted in evercert_certificate_load_errors_total
// and logged once, while the last good certificate keeps being served.
// Recovery is automatic.
//
// SecretCertKey implements dynamiccertificates.CertKeyContentProvider,
// SNICertKeyContentProvider, Notifier and ControllerRunner. It is safe for
// concurrent use.
type SecretCertKey struct {
	listeners
	src      *secretSource
	sniNames []string
	cur      atomic.Pointer[certKeyContent]
}

var (
	_ dynamiccertificates.SNICertKeyContentProvider = &SecretCertKey{}
	_ dynamiccertificates.ControllerRunner          = &SecretCertKey{}
)

// NewSecretCertKey validates cfg and returns a provider with no content yet:
// call RunOnce to load the Secret now and Run to follow it.
func NewSecretCertKey(cfg SecretConfig) (*SecretCertKey, error) {
	src, err := newSecretSource(cfg)
	if err != nil {
		return nil, err
	}
	p := &SecretCertKey{src: src, sniNames: slices.Clone(cfg.SNINames)}
	src.Process, src.Rereads = p.process, true
	return p, nil
}

// Name returns the provider name.
func (p *SecretCertKey) Name() string { return p.src.cfg.Name }

// SNINames returns the explicit SNI names, or nil.
func (p *SecretCertKey) SNINames() []string { return p.sniNames }

// CurrentCertKeyContent returns the last good certificate and key PEM, or
// nil, nil before the first successful load.
func (p *SecretCertKey) CurrentCertKeyContent() ([]byte, []byte) {
	if c := p.cur.Load(); c != nil {
		return c.cert, c.key
	}
	return nil, nil
}

// CurrentParsedCertKeyContent returns what CurrentCertKeyContent returns
// together with the certificate parsed from it (Leaf set), or nil, nil, nil
// before the first successful load. The sni controller serves that
// certificate as is, instead of parsing the PEM again. None of it may be
// modified.
func (p *SecretCertKey) CurrentParsedCertKeyContent() ([]byte, []byte, *tls.Certificate) {
	return p.cur.Load().parsed()
}

// LastError returns the last load or watch error, nil after a success.
func (p *SecretCertKey) LastError() error { return p.src.report.lastError() }

// RunOnce reads the Secret once. Its error names the Secret.
func (p *SecretCertKey) RunOnce(ctx context.Context) error { return p.src.RunOnce(ctx) }

// Run follows the Secret until ctx is done. workers is ignored.
func (p *SecretCertKey) Run(ctx context.Context, _ int) { p.src.Run(ctx) }

func (p *SecretCertKey) process(secret *corev1.Secret) error {
	if secret == nil {
		return p.src.report.failed(fmt.Errorf("secret %s was deleted", p.src.key))
	}
	data, err := secretData(secret, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	if err != nil {
		return p.src.report.failed(fmt.Errorf("secret %s: %w", p.src.key, err))
	}
	changed, err := storeCertKey(&p.cur, p.src.report, data[0], data[1], p.src.cfg.Clock.Now(), "secret", p.src.key)
	if err != nil {
		return p.src.report.failed(fmt.Errorf("secret %s: %w", p.src.key, err))
	}
	if changed {
		p.notify()
	}
	return nil
}

// SecretCA serves the ca.crt of one Secret as a CA bundle, following changes
// like SecretCertKey. It implements dynamiccertificates.CAContentProvider and
// ControllerRunner, and is safe for concurrent use.
type SecretCA struct {
	listeners
	src *secretSource
	cur atomic.Pointer[caContent]
}

var (
	_ dynamiccertificates.CAContentProvider = &SecretCA{}
	_ dynamiccertificates.ControllerRunner  = &SecretCA{}
)

// NewSecretCA validates cfg and returns a CA provider with no content yet.
func NewSecretCA(cfg SecretConfig) (*SecretCA, error) {
	src, err := newSecretSource(cfg)
	if err != nil {
		return nil, err
	}
	p := &SecretCA{src: src}
	src.Process, src.Rereads = p.process, true
	return p, nil
}

// Name returns the provider name.
func (p *SecretCA) Name() string { return p.src.cfg.Name }

// CurrentCABundleContent returns the last good ca.crt, or nil.
func (p *SecretCA) CurrentCABundleContent() []byte {
	if c := p.cur.Load(); c != nil {
		return c.bundle
	}
	return nil
}

// VerifyOptions verifies client certificates against the last good bundle;
// ok is false before the first successful load.
func (p *SecretCA) VerifyOptions() (x509.VerifyOptions, bool) {
	if c := p.cur.Load(); c != nil {
		return c.opts, true
	}
	return x509.VerifyOptions{}, false
}

// RunOnce reads the Secret once.
func (p *SecretCA) RunOnce(ctx context.Context) error { return p.src.RunOnce(ctx) }

// Run follows the Secret until ctx is done. workers is ignored.
func (p *SecretCA) Run(ctx context.Context, _ int) { p.src.Run(ctx) }

func (p *SecretCA) process(secret *corev1.Secret) error {
	if secret == nil {
		return p.src.report.failed(fmt.Errorf("secret %s was deleted", p.src.key))
	}
	data, err := secretData(secret, SecretCAKey)
	if err != nil {
		return p.src.report.failed(fmt.Errorf("secret %s: %w", p.src.key, err))
	}
	if c := p.cur.Load(); c != nil && string(c.bundle) == string(data[0]) {
		p.src.report.succeeded()
		return nil
	}
	pool, certs, err := pki.NewPool(data[0])
	if err != nil {
		return p.src.report.failed(fmt.Errorf("secret %s key %s: %w", p.src.key, SecretCAKey, certreport.WithContent(err, data[0])))
	}
	p.cur.Store(&caContent{bundle: data[0], certs: certs, opts: clientVerifyOptions(pool)})
	p.src.report.succeeded()
	p.src.report.BundleLoaded(certs, "secret", p.src.key)
	p.notify()
	return nil
}
