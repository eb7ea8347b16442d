package dynamiccert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/pki"
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
	// DefaultSecretResync. Ignored by NewAuthority, whose checks bound the
	// age of the watch's cache instead (see AuthorityConfig.CheckInterval).
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
// Secret, once-per-distinct-error reporting, and the run loop.
type secretSource struct {
	cfg    SecretConfig
	key    string // namespace/name, for messages
	report *reporter
	// process handles a Secret (nil: deleted) and returns the load error.
	process func(*corev1.Secret) error
	mu      sync.Mutex // serializes process
	// view is the watch's cache of the Secret while run runs, nil
	// otherwise: the Authority reads it instead of a GET per check.
	view atomic.Pointer[secretView]
	// watchFailing: the watch reported an error and no event arrived
	// since (it backs off or re-lists): the cache may be stale.
	watchFailing atomic.Bool
	// delivered is when (UnixNano on cfg.Clock; 0: never) the watch last
	// showed that its cache is current: a list that succeeded, or an
	// event or bookmark it delivered. An open watch that delivers nothing
	// (a wedged watch cache, a proxy) leaves it behind; see secretReads.
	delivered atomic.Int64
	// rereads: run also re-reads the Secret with a GET every cfg.Resync
	// (SecretCertKey, SecretCA).
	rereads bool
	// handled counts the Secrets process was called with, under mu: a
	// re-read's answer is loaded only if the watch handled nothing while
	// the GET was in flight, which would be as new at least.
	handled uint64
	// handledRV is the resourceVersion last handled, under mu.
	handledRV string
}

// secretView is the informer cache of one Secret source.
type secretView struct {
	store  cache.Store
	synced func() bool
}

func newSecretSource(cfg SecretConfig) (*secretSource, error) {
	switch {
	case cfg.Namespace == "" || cfg.SecretName == "":
		return nil, errors.New("secret source: namespace and name are required")
	case cfg.Client == nil:
		return nil, fmt.Errorf("secret source %s/%s: a client is required", cfg.Namespace, cfg.SecretName)
	}
	key := cfg.Namespace + "/" + cfg.SecretName
	if cfg.Name == "" {
		cfg.Name = "secret:" + key
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultSecretResync
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.EventObject == nil {
		cfg.EventObject = &corev1.ObjectReference{APIVersion: "v1", Kind: "Secret", Namespace: cfg.Namespace, Name: cfg.SecretName}
	}
	return &secretSource{cfg: cfg, key: key, report: newReporter(cfg.Name, cfg.EventRecorder, cfg.EventObject)}, nil
}

func (s *secretSource) handle(secret *corev1.Secret) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handleLocked(secret)
}

func (s *secretSource) handleLocked(secret *corev1.Secret) error {
	s.handled++
	s.handledRV = ""
	if secret != nil {
		s.handledRV = secret.ResourceVersion
	}
	return s.process(secret)
}

// markDelivered records that the watch showed its cache current now.
func (s *secretSource) markDelivered() { s.delivered.Store(s.cfg.Clock.Now().UnixNano()) }

// deliveredAt returns when the watch last showed its cache current (zero:
// never).
func (s *secretSource) deliveredAt() time.Time {
	if n := s.delivered.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// runOnce reads the Secret with a plain GET, so a caller can fail fast at
// start-up when it is missing or forbidden.
func (s *secretSource) runOnce(ctx context.Context) error {
	secret, err := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace).Get(ctx, s.cfg.SecretName, metav1.GetOptions{})
	if err != nil && ctx.Err() != nil {
		return ctx.Err() // cancelled by the caller, not a failure of the Secret
	}
	if err != nil {
		return s.report.failed(fmt.Errorf("reading secret %s: %w", s.key, describeAPIError(err, readVerbs)))
	}
	return s.handle(secret)
}

// run watches the Secret until ctx is done. The watch is restricted to the
// one name, and handshakes never wait on the API: they are served from the
// content cached by process.
func (s *secretSource) run(ctx context.Context) {
	selector := fields.OneTermEqualSelector("metadata.name", s.cfg.SecretName).String()
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			list, err := secrets.List(ctx, opts)
			if err == nil {
				s.markDelivered()
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			w, err := secrets.Watch(ctx, opts)
			if err != nil {
				return nil, err
			}
			return newDeliveryWatch(w, s.markDelivered), nil
		},
	}
	// Fake clients cannot stream a watch-list; this lets the reflector fall
	// back to list+watch for them, and changes nothing for real clients.
	// No informer resync: it only replays the cache, which a watch that
	// delivers nothing leaves as old as it is; the re-read below asks the
	// API server.
	informer := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, s.cfg.Client), &corev1.Secret{}, cache.SharedIndexInformerOptions{})
	_ = informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || ctx.Err() != nil {
			return // the server closed the watch (the reflector re-lists), or we are stopping
		}
		s.watchFailing.Store(true)
		_ = s.report.failed(fmt.Errorf("watching secret %s: %w", s.key, describeAPIError(err, readVerbs)))
	})
	onChange := func(obj any) {
		s.watchFailing.Store(false)
		if secret, ok := obj.(*corev1.Secret); ok {
			_ = s.handle(secret)
		}
	}
	_, _ = informer.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    onChange,
		UpdateFunc: func(_, obj any) { onChange(obj) },
		DeleteFunc: func(any) {
			s.watchFailing.Store(false)
			_ = s.handle(nil)
		},
	}, cache.HandlerOptions{})
	view := &secretView{store: informer.GetStore(), synced: informer.HasSynced}
	s.view.Store(view)
	defer s.view.CompareAndSwap(view, nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	if s.rereads {
		wg.Go(func() { s.rereadEvery(ctx) })
	}
	informer.RunWithContext(ctx)
}

// rereadEvery re-reads the Secret every cfg.Resync until ctx is done, and
// after a failure retries with backoff (internal/backoff, capped at
// cfg.Resync), on cfg.Clock. It is what makes Resync true when the watch
// stays open but delivers nothing: the informer would only replay its
// cache.
func (s *secretSource) rereadEvery(ctx context.Context) {
	retry := backoff.New(backoff.DefaultInitial, s.cfg.Resync)
	wait := s.cfg.Resync
	for {
		t := s.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		err := s.reread(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			wait = retry.Next(err)
		default:
			retry.Reset()
			wait = s.cfg.Resync
		}
	}
}

// reread GETs the Secret and loads it, unless the watch handled a Secret
// while the GET was in flight. A failed GET is reported (counted once per
// distinct failure) and returned; content that fails to load is reported
// by process and is not a reason to retry sooner.
func (s *secretSource) reread(ctx context.Context) error {
	s.mu.Lock()
	before := s.handled
	s.mu.Unlock()
	secret, err := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace).Get(ctx, s.cfg.SecretName, metav1.GetOptions{})
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case apierrors.IsNotFound(err):
		secret = nil // deleted: reported as a delete event is
	case err != nil:
		return s.report.failed(fmt.Errorf("re-reading secret %s: %w", s.key, describeAPIError(err, readVerbs)))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handled != before {
		return nil // the watch delivered meanwhile: as new at least
	}
	if secret != nil && secret.ResourceVersion != s.handledRV {
		// A change the watch did not deliver (or has not yet): say so, a
		// wedged watch is otherwise invisible.
		klog.FromContext(ctx).Info("Secret changed without a watch event; loading it from a re-read", "provider", s.cfg.Name, "secret", s.key,
			"resourceVersion", secret.ResourceVersion, "lastDelivered", s.handledRV)
	}
	_ = s.handleLocked(secret)
	return nil
}

// deliveryWatch passes a watch's events on unchanged and calls delivered
// for each event or bookmark (not for an error): what secretReads needs to
// tell a quiet watch (bookmarks arrive) from a wedged one (nothing does).
type deliveryWatch struct {
	watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func newDeliveryWatch(w watch.Interface, delivered func()) watch.Interface {
	d := &deliveryWatch{Interface: w, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(d.out)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Error {
				delivered()
			}
			select {
			case d.out <- ev:
			case <-d.stop:
				return
			}
		}
	}()
	return d
}

func (d *deliveryWatch) ResultChan() <-chan watch.Event { return d.out }

func (d *deliveryWatch) Stop() {
	d.once.Do(func() { close(d.stop) })
	d.Interface.Stop()
}

// readVerbs are what every Secret source reads its Secret with.
const readVerbs = "get, list and watch on this Secret"

// describeAPIError turns the API errors a Secret source meets into messages
// an operator can act on; verbs are what RBAC must allow for the request
// that failed, so a denied create is not reported as a missing get.
func describeAPIError(err error, verbs string) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("not found: %w", err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("forbidden (RBAC must allow %s): %w", verbs, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("unauthorized (check the client's credentials): %w", err)
	}
	return err
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
	src.process, src.rereads = p.process, true
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
func (p *SecretCertKey) RunOnce(ctx context.Context) error { return p.src.runOnce(ctx) }

// Run follows the Secret until ctx is done. workers is ignored.
func (p *SecretCertKey) Run(ctx context.Context, _ int) { p.src.run(ctx) }

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
	src.process, src.rereads = p.process, true
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
func (p *SecretCA) RunOnce(ctx context.Context) error { return p.src.runOnce(ctx) }

// Run follows the Secret until ctx is done. workers is ignored.
func (p *SecretCA) Run(ctx context.Context, _ int) { p.src.run(ctx) }

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
