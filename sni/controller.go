package sni

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/errlog"
)

// ErrNotReady is returned by GetConfigForClient, and so fails the
// handshake, until the controller has built its first snapshot (RunOnce or
// Run succeeded once).
var ErrNotReady = errors.New("sni: serving certificates are not loaded yet")

// workItemKey is the only key ever queued: every notification means
// "re-read the providers", so the queue coalesces them into one sync.
const workItemKey = "sync"

// DynamicServingCertificateController keeps a TLS server's certificates in
// step with its providers; see the package documentation for the data flow
// and the selection rules.
//
// All methods are safe for concurrent use. GetConfigForClient and the
// GetCertificate of the config it returns never block, and do not allocate
// (GetCertificate allocates only to lower-case an SNI name that has
// upper-case letters, which clients rarely send, and, for a name served
// with certificates of several key algorithms, inside crypto/tls's
// SupportsCertificate: 2 allocations for a client that takes the ECDSA
// certificate, 10 for an RSA-only TLS 1.2 client, with Go 1.26).
type DynamicServingCertificateController struct {
	opts options

	// base is a private clone of the caller's config, never used for a
	// handshake and never modified, from which each snapshot's config is
	// cloned.
	base       *tls.Config
	clientAuth tls.ClientAuthType

	// current is nil until the first successful sync.
	current atomic.Pointer[snapshot]

	queue workqueue.TypedRateLimitingInterface[string]

	// syncMu serialises syncs: the slots are a single-writer cache.
	syncMu sync.Mutex
	// serving holds the serving provider's slot and its alternatives';
	// empty without a serving provider. Guarded by syncMu.
	serving  []*certSlot
	sniSlots []*certSlot // guarded by syncMu; alternatives right after their provider
	clientCA *caSlot     // guarded by syncMu; nil without a client CA provider

	// dirtyMu guards what the next sync must re-read: the slots whose
	// provider notified (dirty, deduplicated by certSlot.queued), whether
	// the client CA provider notified, and whether every provider must be
	// read (readAll).
	dirtyMu sync.Mutex
	dirty   []*certSlot
	caDirty bool
	readAll bool

	listenersMu sync.Mutex
	listeners   []dynamiccertificates.Listener

	// syncLog logs a failing sync once per distinct error.
	syncLog errlog.Once

	// onParse, when set (by tests, before the first sync), is called with the
	// provider name before each parse of new content; it may be called
	// from several goroutines at once (see fetchAll).
	onParse func(provider string)
	// aggregated are the slots whose metrics are reported together (see
	// aggregateMetrics), nil when each has its own; expiry is their
	// expiration gauge. Guarded by syncMu.
	aggregated []*certSlot
	expiry     earliestExpiry

	// parseWorkers, when set (by tests, before the first sync), replaces
	// GOMAXPROCS as the number of goroutines that read and parse the
	// providers in a sync that reads them all.
	parseWorkers int
}

var _ dynamiccertificates.Listener = &DynamicServingCertificateController{}
var _ dynamiccertificates.Notifier = &DynamicServingCertificateController{}

// NewDynamicServingCertificateController returns a controller serving the
// certificates of cfg.Serving and cfg.SNI, verifying client certificates
// against cfg.ClientCA. It fails, naming the field, when cfg is invalid.
//
// The controller registers a listener on every provider in cfg, once, and
// on a notification re-reads that provider alone; it does not run the
// providers, which is their owner's job. Nothing is loaded until RunOnce or
// Run.
func NewDynamicServingCertificateController(cfg ControllerConfig) (*DynamicServingCertificateController, error) {
	o, base, err := cfg.complete()
	if err != nil {
		return nil, err
	}
	clientCA, serving, sniCerts := cfg.ClientCA, cfg.Serving, cfg.SNI
	c := &DynamicServingCertificateController{
		opts: o,
		base: base.Clone(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: o.name},
		),
	}

	if c.base.Time == nil && cfg.Clock != nil {
		// Client certificates are verified on the injected clock, the one
		// that judges the served certificates: on a fake clock stepped
		// ahead, a client leaf issued on it would be "not yet valid" by
		// the wall clock and refused.
		c.base.Time = cfg.Clock.Now
	}
	switch {
	case cfg.ClientAuth != tls.NoClientCert:
		c.clientAuth = cfg.ClientAuth
	case base.ClientAuth != tls.NoClientCert:
		c.clientAuth = base.ClientAuth
	case clientCA != nil:
		c.clientAuth = tls.VerifyClientCertIfGiven
	default:
		c.clientAuth = tls.NoClientCert
	}

	if clientCA != nil {
		c.clientCA = &caSlot{provider: clientCA, name: clientCA.Name(), report: certreport.New(clientCA.Name(), o.eventRecorder, o.eventObject)}
		clientCA.AddListener(caListener{c})
	}
	if serving != nil {
		slot := newCertSlot(o, serving, nil, RoleServing)
		c.serving = append(c.serving, slot)
		serving.AddListener(slotListener{c, slot})
		for _, alt := range alternativesOf(serving) {
			if alt == nil {
				continue
			}
			// Another serving certificate: it claims no names either.
			slot := newCertSlot(o, alt, nil, RoleServing)
			c.serving = append(c.serving, slot)
			alt.AddListener(slotListener{c, slot})
		}
	}
	for _, p := range sniCerts {
		if p == nil {
			continue
		}
		primary := newCertSlot(o, p, p, RoleSNI)
		c.sniSlots = append(c.sniSlots, primary)
		p.AddListener(slotListener{c, primary})
		for _, alt := range alternativesOf(p) {
			if alt == nil {
				continue
			}
			slot := newCertSlot(o, alt, alt, RoleSNI)
			if primary.nameOnly {
				// The alternatives of a name-only provider are name-only
				// too, and serve its names with it.
				slot.nameOnly, slot.owner = true, primary
			}
			c.sniSlots = append(c.sniSlots, slot)
			alt.AddListener(slotListener{c, slot})
		}
	}
	c.aggregated = aggregateMetrics(o, slices.Collect(chainSlots(c.serving, c.sniSlots)))
	return c, nil
}

// slotListener is the listener the controller registers with a certificate
// provider: a notification marks that provider for the next sync, which
// re-reads only the marked providers, so a rotation among 100,000 providers
// reads one.
type slotListener struct {
	c    *DynamicServingCertificateController
	slot *certSlot
}

func (l slotListener) Enqueue() {
	l.c.dirtyMu.Lock()
	if !l.slot.queued {
		l.slot.queued = true
		l.c.dirty = append(l.c.dirty, l.slot)
	}
	l.c.dirtyMu.Unlock()
	l.c.queue.Add(workItemKey)
}

// caListener is slotListener for the client CA provider.
type caListener struct {
	c *DynamicServingCertificateController
}

func (l caListener) Enqueue() {
	l.c.dirtyMu.Lock()
	l.c.caDirty = true
	l.c.dirtyMu.Unlock()
	l.c.queue.Add(workItemKey)
}

// GetConfigForClient implements tls.Config.GetConfigForClient. It returns
// the current snapshot's prepared config, shared by all handshakes: callers
// must not modify it. Before the first successful sync it returns
// (nil, ErrNotReady). It does not allocate.
//
// Use it (or TLSConfig, which sets it) when evercert owns the TLS settings:
// the returned config replaces the listener's config for the whole
// handshake, so its version floor, cipher suites, ALPN protocols and client
// authentication are those of the controller's base config and client CA
// provider. Setting it on a config that a framework built would silently
// drop that framework's ClientAuth, ClientCAs, MinVersion and NextProtos;
// use SetGetCertificate there.
func (c *DynamicServingCertificateController) GetConfigForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	s := c.current.Load()
	if s == nil {
		return nil, ErrNotReady
	}
	return s.config, nil
}

// GetCertificate implements tls.Config.GetCertificate with the current
// snapshot's selection (exact name, wildcard, local IP, default; then the
// first certificate the client supports when there are several key
// algorithms). Before the first successful sync it returns ErrNotReady. It
// does not allocate for a match with one certificate.
//
// Use it when a framework owns the tls.Config (controller-runtime's webhook
// and metrics servers, a genericapiserver, gRPC): only the certificate comes
// from the controller, and everything else, including client
// authentication, stays the framework's. The controller's base config and
// client CA provider then play no part in the handshake.
func (c *DynamicServingCertificateController) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	s := c.current.Load()
	if s == nil {
		return nil, ErrNotReady
	}
	return s.getCertificate(hello)
}

// SetGetCertificate sets cfg.GetCertificate to c.GetCertificate and changes
// nothing else, so certificates rotate while the caller's settings (client
// CAs and ClientAuth, MinVersion, cipher suites, NextProtos) stay in force.
// Its method value fits option lists such as controller-runtime's
// webhook.Options.TLSOpts:
//
//	TLSOpts: []func(*tls.Config){ctrl.SetGetCertificate}
//
// cfg must not be in use by a server yet.
func (c *DynamicServingCertificateController) SetGetCertificate(cfg *tls.Config) {
	cfg.GetCertificate = c.GetCertificate
}

// TLSConfig returns a new clone of base with GetConfigForClient set to
// c.GetConfigForClient, for http.Server.TLSConfig or tls.NewListener. Each
// call returns a separate config the caller owns.
//
// Session tickets: unless base sets ticket keys explicitly, crypto/tls
// encrypts tickets with the automatic keys of the config returned here (the
// one the listener uses), not those of the per-snapshot configs, so
// resumption keeps working across snapshot swaps. Tickets are not shared
// between two configs returned by separate calls.
func (c *DynamicServingCertificateController) TLSConfig() *tls.Config {
	cfg := c.base.Clone()
	cfg.GetConfigForClient = c.GetConfigForClient
	return cfg
}

// RunOnce reads every provider once and installs a snapshot if anything
// changed, priming the controller before serving. It returns an error only
// if no certificate at all could be loaded (or ctx is done); a provider with
// bad content is logged, counted in evercert_certificate_load_errors_total
// and left out (or kept at its last good certificate), and the others are
// served. It may be called concurrently with Run; syncs are serialised.
//
// A sync that reads every provider (this one, Run's first, the periodic
// resync, an Enqueue) reads and parses them on GOMAXPROCS goroutines, then
// reports and indexes the results in provider order, so the snapshot, the
// precedence among providers and what is reported are those of a
// sequential read; a sync after a few providers notified reads those
// alone, on the sync goroutine. Providers are therefore read concurrently
// with each other (each by one goroutine at a time, unless it is given
// twice): they must be safe for concurrent use, as providers already are,
// since their own goroutines change their content while a controller
// reads it.
func (c *DynamicServingCertificateController) RunOnce(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := c.sync(true)
	return err
}

// Run syncs once if RunOnce has not succeeded yet, then processes
// notifications until ctx is done, and returns after its goroutines have
// stopped. It also re-reads the providers every resync interval (see
// ControllerConfig.ResyncInterval). Only one worker ever runs, whatever workers says:
// a sync covers all providers, so more workers could not do more work.
// Run must be called at most once; it shuts the work queue down on return.
func (c *DynamicServingCertificateController) Run(ctx context.Context, workers int) {
	defer utilruntime.HandleCrashWithContext(ctx)

	logger := klog.FromContext(ctx).WithValues("controller", c.opts.name)
	logger.Info("Starting controller")
	defer logger.Info("Shutting down controller")

	if !c.HasSynced() {
		if err := c.RunOnce(ctx); err != nil && ctx.Err() == nil {
			c.syncLog.Error(logger, err, "Initial certificate sync failed; retrying")
			c.queue.AddRateLimited(workItemKey)
		}
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		wait.UntilWithContext(ctx, func(context.Context) {
			for c.processNextWorkItem(logger) {
			}
		}, time.Second)
	})
	if c.opts.resync > 0 {
		wg.Go(func() {
			wait.UntilWithContext(ctx, func(context.Context) { c.Enqueue() }, c.opts.resync)
		})
	}

	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
}

// processNextWorkItem syncs once per queued notification. A failing sync is
// retried with the queue's rate limiter and logged once per distinct error,
// not once per retry.
func (c *DynamicServingCertificateController) processNextWorkItem(logger klog.Logger) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)

	retry, err := c.sync(false)
	if err != nil {
		c.syncLog.Error(logger, err, "Certificate sync failed; retrying")
	} else {
		c.syncLog.Recovered(logger, "Certificate sync succeeded again")
	}
	if err != nil || retry {
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// Enqueue implements dynamiccertificates.Listener: it asks for a re-read of
// all providers. It never blocks; calls made before a pending sync starts
// are merged into it. Calls after Run returned are ignored. (The providers
// given to NewDynamicServingCertificateController need not call it: the
// controller listens to each of them, and re-reads only those that
// notified.)
func (c *DynamicServingCertificateController) Enqueue() {
	c.dirtyMu.Lock()
	c.readAll = true
	c.dirtyMu.Unlock()
	c.queue.Add(workItemKey)
}

// HasSynced reports whether a snapshot has been installed, that is whether
// handshakes can succeed.
func (c *DynamicServingCertificateController) HasSynced() bool {
	return c.current.Load() != nil
}

// AddListener implements dynamiccertificates.Notifier: l.Enqueue is called
// after each successful snapshot swap (not for swaps that happened before
// l was added). Listeners are called from the sync goroutine and must not
// block.
func (c *DynamicServingCertificateController) AddListener(l dynamiccertificates.Listener) {
	c.listenersMu.Lock()
	defer c.listenersMu.Unlock()
	c.listeners = append(c.listeners, l)
}

// Served describes what the current snapshot serves: the serving
// certificate and its alternatives, then the SNI certificates in provider
// order, each followed by its alternatives (providers that never had valid
// content are absent), then the client CA certificates. It returns a fresh
// copy, nil before the first sync.
func (c *DynamicServingCertificateController) Served() []ServedCertificate {
	s := c.current.Load()
	if s == nil {
		return nil
	}
	return s.servedCopy()
}

// sync refreshes the parse cache from the providers that notified (from
// every provider when all is set, when Enqueue asked for it, before the
// first snapshot, and after a sync that failed or must be retried) and,
// when anything the snapshot depends on changed (or there is no snapshot
// yet), makes and swaps in a new snapshot and notifies the listeners. retry
// is true when a provider's content may become valid with time alone. err
// is non-nil only when no snapshot could be built.
func (c *DynamicServingCertificateController) sync(all bool) (retry bool, err error) {
	c.syncMu.Lock()
	swapped, retry, err := c.syncLocked(all)
	c.syncMu.Unlock()

	if swapped {
		c.listenersMu.Lock()
		listeners := c.listeners
		c.listenersMu.Unlock()
		for _, l := range listeners {
			l.Enqueue()
		}
	}
	return retry, err
}

func (c *DynamicServingCertificateController) syncLocked(all bool) (swapped, retry bool, err error) {
	c.dirtyMu.Lock()
	dirty, caDirty := c.dirty, c.caDirty
	all = all || c.readAll || c.current.Load() == nil
	for _, slot := range dirty {
		slot.queued = false
	}
	c.dirty, c.caDirty, c.readAll = nil, false, false
	c.dirtyMu.Unlock()
	defer func() {
		if retry || err != nil {
			// The retry re-reads everything, as the first attempt would have.
			c.dirtyMu.Lock()
			c.readAll = true
			c.dirtyMu.Unlock()
		}
	}()

	now := c.opts.clock.Now()
	changed := false
	var errs []error
	apply := func(res refreshResult) {
		changed = changed || res.changed
		retry = retry || res.retry
		if res.err != nil {
			errs = append(errs, res.err)
		}
	}
	// reindex is whether any slot's names or presence changed since the
	// last full build; rotated are the slots whose certificate changed
	// since the current snapshot was made.
	reindex := false
	var rotated, expiring []*certSlot
	note := func(slot *certSlot) {
		reindex = reindex || slot.reindex
		if slot.pair != slot.inSnapshot {
			rotated = append(rotated, slot)
		}
		if slot.aggregated && slot.pair != nil && slot.pair != slot.inSnapshot {
			expiring = append(expiring, slot)
		}
	}
	if c.clientCA != nil && (all || caDirty) {
		apply(c.clientCA.refresh(c))
	}
	if all {
		// Read and parse on every core, then apply in order.
		slots := slices.AppendSeq(make([]*certSlot, 0, len(c.serving)+len(c.sniSlots)), chainSlots(c.serving, c.sniSlots))
		for i, f := range c.fetchAll(slots, now) {
			apply(slots[i].apply(c, f))
			note(slots[i])
		}
	} else {
		// Only providers that notified can have changed: the others'
		// slots are as the current snapshot has them (see note).
		for _, slot := range dirty {
			apply(slot.refresh(c, now))
			note(slot)
		}
	}

	if len(expiring) > 0 {
		c.expiry.update(c.opts.name, c.aggregated, expiring)
	}

	prev := c.current.Load()
	if !changed && prev != nil {
		return false, retry, nil
	}
	in := snapshotInput{
		base:       c.base,
		clientAuth: c.clientAuth,
		serving:    c.serving,
		sni:        c.sniSlots,
		clientCA:   c.clientCA,
	}
	if prev != nil && !reindex {
		c.current.Store(deriveSnapshot(prev, in, rotated))
		for _, slot := range rotated {
			slot.inSnapshot = slot.pair
		}
		return true, retry, nil
	}
	s, err := buildSnapshot(in)
	if err != nil {
		if len(errs) > 0 {
			err = fmt.Errorf("%w: %w", err, errors.Join(errs...))
		}
		return false, retry, fmt.Errorf("%s: %w", c.opts.name, err)
	}
	c.current.Store(s)
	// The index was rebuilt: every slot is now as the snapshot has it.
	for slot := range chainSlots(c.serving, c.sniSlots) {
		slot.inSnapshot, slot.reindex = slot.pair, false
	}
	return true, retry, nil
}
