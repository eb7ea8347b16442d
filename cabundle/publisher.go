package cabundle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	"github.com/evercert/evercert/internal/certmetrics"
)

const (
	// DefaultResync is the default period of the safety-net re-publish.
	DefaultResync = time.Minute
	// DefaultFieldManager is the default field manager of every write.
	DefaultFieldManager = "evercert"

	// Retry backoff per target. The base is short because the common
	// failure, a conflict with a cache that is a few milliseconds behind,
	// resolves almost at once; the cap keeps a forbidden or unreachable API
	// from being hammered while still retrying twice a minute.
	retryBaseDelay = 100 * time.Millisecond
	retryMaxDelay  = 30 * time.Second

	// maxWorkers bounds concurrent writes. Targets are few and each write is
	// one request, so a handful is plenty; more than one keeps a target whose
	// requests hang (API server unreachable) from delaying the others.
	maxWorkers = 4

	userAgent = "evercert-cabundle"
)

// Result values of evercert_cabundle_publish_total.
const (
	resultSuccess   = "success"
	resultUnchanged = "unchanged"
	resultConflict  = "conflict"
	resultError     = "error"
)

// Config configures a [Publisher].
type Config struct {
	// Source provides the CA bundle to publish. Required. The publisher
	// registers itself as a listener, so a provider that notifies on change
	// gets its new bundle published at once; one that does not is still
	// picked up at the next resync. While the bundle is empty nothing is
	// written.
	Source dynamiccertificates.CAContentProvider

	// Targets lists the objects to write into. At least one is required.
	// Several targets may select the same object: the object then gets the
	// union of the fields they select.
	Targets []Target

	// KubeConfig is used to build the clients that are not given below.
	// It is copied, not modified.
	KubeConfig *rest.Config
	// KubeClient serves the webhook configuration kinds. When nil it is
	// built from KubeConfig if a target needs it.
	KubeClient kubernetes.Interface
	// APIExtensionsClient serves CustomResourceDefinitions. When nil it is
	// built from KubeConfig if a target needs it.
	APIExtensionsClient apiextensionsclient.Interface
	// AggregatorClient serves APIServices. When nil it is built from
	// KubeConfig if a target needs it.
	AggregatorClient aggregatorclient.Interface

	// Resync is the period at which every target is worked on even without
	// any event: a safety net for a provider that changes its bundle
	// without notifying its listeners, and for work lost in any other way.
	// The comparison is made against the informer cache (which the informer
	// keeps consistent by relisting whenever its watch fails), so an
	// up-to-date object costs no request. Zero means DefaultResync (one
	// minute); it must not be negative.
	Resync time.Duration

	// UseServerSideApply writes with server-side apply (force, so that a
	// caBundle someone else wrote is taken over) instead of a JSON patch.
	// The applied object holds only the caBundle fields and, for webhook
	// configurations, the name of each selected webhook, which is the key of
	// the webhooks list. Note that co-owning that key has the usual
	// server-side-apply consequence: a webhook the publisher writes into is
	// not removed by another manager's apply that omits it; remove the
	// target first, or delete the webhook with an update or JSON patch.
	UseServerSideApply bool

	// FieldManager is the field manager of every write, in both modes.
	// Empty means DefaultFieldManager ("evercert").
	FieldManager string
}

// Publisher keeps the caBundle of its targets equal to its source's current
// bundle; see the package documentation for how. Create it with [New] and
// start it with [Publisher.Run]. Its methods are safe for concurrent use.
type Publisher struct {
	source       dynamiccertificates.CAContentProvider
	targets      []*targetState
	resync       time.Duration
	ssa          bool
	fieldManager string

	// queue holds target indexes. A target is the unit of work, so bursts
	// of events about it (bundle change, watch events, resync) coalesce,
	// and retries back off per target.
	queue   workqueue.TypedRateLimitingInterface[int]
	started atomic.Bool
	ready   chan struct{}

	// logger is set by Run before any goroutine that reads it starts.
	logger klog.Logger

	mu       sync.Mutex
	notReady int                    // targets not yet published once
	logged   map[string]string      // object key -> last state logged, to log each state once
	written  map[string]writeRecord // object key -> last successful write
}

// writeRecord remembers a successful write so that a cache which has not yet
// seen it is not mistaken for drift: without it, every event that arrives
// between the write and its watch event would write again (and, with the
// resourceVersion precondition, fail with a spurious conflict).
type writeRecord struct {
	// fromRV is the resourceVersion the write was based on.
	fromRV string
	bundle string
}

// targetState is a target with its informer and progress.
type targetState struct {
	Target
	adapter  *kindAdapter
	informer cache.SharedIndexInformer
	ready    bool // guarded by Publisher.mu
}

// New validates cfg, builds any missing client and the informers, and
// returns a Publisher that does nothing until Run is called. Errors name the
// offending target.
func New(cfg Config) (*Publisher, error) {
	if cfg.Source == nil {
		return nil, errors.New("cabundle: Config.Source is required")
	}
	if len(cfg.Targets) == 0 {
		return nil, errors.New("cabundle: Config.Targets is empty")
	}
	if cfg.Resync < 0 {
		return nil, fmt.Errorf("cabundle: Config.Resync must not be negative, got %v", cfg.Resync)
	}
	p := &Publisher{
		source:       cfg.Source,
		resync:       cfg.Resync,
		ssa:          cfg.UseServerSideApply,
		fieldManager: cfg.FieldManager,
		queue: workqueue.NewTypedRateLimitingQueue(
			workqueue.NewTypedItemExponentialFailureRateLimiter[int](retryBaseDelay, retryMaxDelay)),
		ready:   make(chan struct{}),
		logger:  klog.Background(),
		logged:  make(map[string]string),
		written: make(map[string]writeRecord),
	}
	if p.resync == 0 {
		p.resync = DefaultResync
	}
	if p.fieldManager == "" {
		p.fieldManager = DefaultFieldManager
	}

	// Validate everything before building any client, so that a bad
	// target is reported as such rather than as a missing client.
	for i, t := range cfg.Targets {
		if err := t.validate(); err != nil {
			return nil, fmt.Errorf("cabundle: target %d (%s): %w", i, t, err)
		}
	}
	adapters := make(map[Kind]*kindAdapter)
	for i, t := range cfg.Targets {
		if t.Service != nil {
			// Copy, so the caller cannot change the filter under us.
			svc := *t.Service
			t.Service = &svc
		}
		a, err := adapterFor(t.Kind, &cfg, adapters)
		if err != nil {
			return nil, fmt.Errorf("cabundle: target %d (%s): %w", i, t, err)
		}
		ts := &targetState{Target: t, adapter: a, informer: a.newInformer(listOptionsFor(t))}
		if err := ts.informer.SetTransform(a.transform); err != nil {
			return nil, fmt.Errorf("cabundle: target %d (%s): set informer transform: %w", i, t, err)
		}
		idx := i
		enqueue := func() { p.queue.Add(idx) }
		if _, err := ts.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { enqueue() },
			UpdateFunc: func(any, any) { enqueue() },
			DeleteFunc: func(obj any) {
				// Drop the bookkeeping of the object, so that objects
				// coming and going under a selector do not accumulate.
				// The target is queued because a deleted named object
				// goes back to waiting, which is worth a log line.
				if name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
					p.forget(objectKey(t.Kind, name))
				}
				enqueue()
			},
		}); err != nil {
			return nil, fmt.Errorf("cabundle: target %d (%s): add event handler: %w", i, t, err)
		}
		p.targets = append(p.targets, ts)
	}
	p.notReady = len(p.targets)
	return p, nil
}

// adapterFor returns the (shared) adapter of kind, building its client from
// cfg.KubeConfig when cfg does not hold one.
func adapterFor(kind Kind, cfg *Config, adapters map[Kind]*kindAdapter) (*kindAdapter, error) {
	if a, ok := adapters[kind]; ok {
		return a, nil
	}
	restConfig := func(field string) (*rest.Config, error) {
		if cfg.KubeConfig == nil {
			return nil, fmt.Errorf("neither Config.%s nor Config.KubeConfig is set", field)
		}
		return rest.AddUserAgent(rest.CopyConfig(cfg.KubeConfig), userAgent), nil
	}
	var a *kindAdapter
	switch kind {
	case ValidatingWebhookConfiguration, MutatingWebhookConfiguration:
		if cfg.KubeClient == nil {
			rc, err := restConfig("KubeClient")
			if err != nil {
				return nil, err
			}
			if cfg.KubeClient, err = kubernetes.NewForConfig(rc); err != nil {
				return nil, fmt.Errorf("build Kubernetes client: %w", err)
			}
		}
		if kind == ValidatingWebhookConfiguration {
			a = validatingWebhookAdapter(cfg.KubeClient)
		} else {
			a = mutatingWebhookAdapter(cfg.KubeClient)
		}
	case CustomResourceDefinition:
		if cfg.APIExtensionsClient == nil {
			rc, err := restConfig("APIExtensionsClient")
			if err != nil {
				return nil, err
			}
			if cfg.APIExtensionsClient, err = apiextensionsclient.NewForConfig(rc); err != nil {
				return nil, fmt.Errorf("build apiextensions client: %w", err)
			}
		}
		a = crdAdapter(cfg.APIExtensionsClient)
	case APIService:
		if cfg.AggregatorClient == nil {
			rc, err := restConfig("AggregatorClient")
			if err != nil {
				return nil, err
			}
			if cfg.AggregatorClient, err = aggregatorclient.NewForConfig(rc); err != nil {
				return nil, fmt.Errorf("build apiregistration client: %w", err)
			}
		}
		a = apiServiceAdapter(cfg.AggregatorClient)
	default:
		return nil, fmt.Errorf("unsupported kind %q", kind)
	}
	adapters[kind] = a
	return a, nil
}

// listOptionsFor restricts a target's informer on the server: to the one
// object for a named target (so its cache holds a single object, and RBAC
// can restrict list and watch to that name), to matching labels otherwise.
func listOptionsFor(t Target) func(*metav1.ListOptions) {
	if t.Name != "" {
		sel := fields.OneTermEqualSelector("metadata.name", t.Name).String()
		return func(o *metav1.ListOptions) { o.FieldSelector = sel }
	}
	sel := t.Selector.String()
	return func(o *metav1.ListOptions) { o.LabelSelector = sel }
}

// Ready returns a channel that is closed once every target has been
// published to successfully at least once: for a named target, once the
// object holds the bundle (written by the publisher, or found already
// right); for a selector target, once a pass over all objects it selected
// at that time succeeded, even if it selected none. It stays open while
// any named target is missing, has nothing to inject, or cannot be written,
// and forever if Run stops before that.
func (p *Publisher) Ready() <-chan struct{} { return p.ready }

// enqueuer adapts the publisher to dynamiccertificates.Listener without
// exporting an Enqueue method.
type enqueuer struct{ p *Publisher }

// Enqueue queues every target. It never blocks.
func (e enqueuer) Enqueue() { e.p.enqueueAll() }

func (p *Publisher) enqueueAll() {
	for i := range p.targets {
		p.queue.Add(i)
	}
}

// Run starts the informers, the workers and the resync timer and blocks until
// ctx is done. It then stops everything it started and returns nil once no
// goroutine of the publisher is left. Logging uses klog.FromContext(ctx). Run
// may be called only once; a second call returns an error at once.
func (p *Publisher) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("cabundle: Publisher.Run called more than once")
	}
	p.logger = klog.FromContext(ctx).WithName("cabundle")
	ctx = klog.NewContext(ctx, p.logger)

	var wg sync.WaitGroup
	// Deferred calls run last-in first-out: the queue is shut down first so
	// that idle workers return, then everything is waited for.
	defer wg.Wait()
	defer p.queue.ShutDown()

	// Providers have no RemoveListener; after Run returns, the listener
	// adds to a shut-down queue, which drops the item.
	p.source.AddListener(enqueuer{p})

	for i, t := range p.targets {
		wg.Go(func() { t.informer.RunWithContext(ctx) })
		// A target is worked on only once its own cache is complete, so
		// that "missing" really means missing. Each target waits for itself
		// alone: one kind the identity may not list must not hold up the
		// others.
		wg.Go(func() {
			if cache.WaitForCacheSync(ctx.Done(), t.informer.HasSynced) {
				p.queue.Add(i)
			}
		})
	}
	for range min(len(p.targets), maxWorkers) {
		wg.Go(func() {
			for p.processNext(ctx) {
			}
		})
	}
	wg.Go(func() {
		ticker := time.NewTicker(p.resync)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				p.enqueueAll()
			}
		}
	})

	p.logger.V(1).Info("Starting caBundle publisher", "targets", len(p.targets), "serverSideApply", p.ssa, "resync", p.resync)
	<-ctx.Done()
	p.logger.V(1).Info("Stopping caBundle publisher")
	return nil
}

// processNext works on one target; it returns false once the queue is shut
// down.
func (p *Publisher) processNext(ctx context.Context) bool {
	i, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(i)
	if err := p.syncTarget(ctx, p.targets[i]); err != nil {
		if ctx.Err() == nil {
			p.queue.AddRateLimited(i)
		}
		return true
	}
	p.queue.Forget(i)
	return true
}

// syncTarget publishes to every object of t that needs it. It returns an
// error (already counted and logged) when any write failed, so that the
// target is retried with backoff.
func (p *Publisher) syncTarget(ctx context.Context, t *targetState) error {
	if !t.informer.HasSynced() {
		// Queued by an event of the initial list; the waiter in Run queues
		// the target again once the list is complete.
		return nil
	}
	bundle := p.source.CurrentCABundleContent()
	if len(bundle) == 0 {
		// An empty caBundle would make the API server fall back to the
		// system roots; never write one.
		p.logState("source", "waiting", "Waiting for the CA provider to have a bundle", "provider", p.source.Name())
		return nil
	}
	p.logState("source", "ok", "")

	var views []objectView
	indexer := t.informer.GetIndexer()
	if t.Name != "" {
		obj, exists, err := indexer.GetByKey(t.Name)
		if err != nil {
			return fmt.Errorf("reading %s %q from the informer cache: %w", t.Kind, t.Name, err)
		}
		if !exists {
			p.logState(objectKey(t.Kind, t.Name), "waiting: missing",
				"Waiting for the object to exist before publishing its caBundle", "kind", t.Kind, "name", t.Name)
			return nil
		}
		if v, ok := t.adapter.view(obj); ok {
			views = append(views, v)
		}
	} else {
		for _, obj := range indexer.List() {
			if v, ok := t.adapter.view(obj); ok && t.selects(v.name, v.labels) {
				views = append(views, v)
			}
		}
		slices.SortFunc(views, func(a, b objectView) int { return strings.Compare(a.name, b.name) })
	}

	var errs []error
	published := t.Name == "" // a selector target is done when nothing failed
	for _, v := range views {
		ok, err := p.publish(ctx, t, v, bundle)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			published = true
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if published {
		p.markReady(t)
	}
	return nil
}

// publish writes bundle into the object v when it differs. published is
// true when the object holds the bundle afterwards.
func (p *Publisher) publish(ctx context.Context, t *targetState, v objectView, bundle []byte) (published bool, err error) {
	kind := t.Kind
	key := objectKey(kind, v.name)
	logger := p.logger.WithValues("kind", kind, "name", v.name)

	selected := p.selectedSlots(kind, v)
	if len(selected) == 0 {
		reason := v.none
		if reason == "" && t.Service != nil {
			reason = "no caBundle field of it refers to service " + t.Service.String()
		}
		if t.Name != "" {
			p.logState(key, "waiting: "+reason,
				"Waiting for the object to have a caBundle field to publish to", "kind", kind, "name", v.name, "reason", reason)
		} else {
			// A selector can legitimately match objects of no concern.
			logger.V(4).Info("Skipping object with nothing to publish to", "reason", reason)
		}
		return false, nil
	}
	if p.cacheBehindOwnWrite(key, v.resourceVersion, bundle) {
		certmetrics.CABundlePublished(string(kind), resultUnchanged)
		return true, nil
	}
	stale := 0
	for _, s := range selected {
		if string(s.current) != string(bundle) {
			stale++
		}
	}
	if stale == 0 {
		certmetrics.CABundlePublished(string(kind), resultUnchanged)
		p.logState(key, "ok", "")
		return true, nil
	}

	pt, data, err := p.buildWrite(t.adapter, v, selected, bundle)
	if err != nil {
		// Encoding plain maps and slices cannot fail; report it anyway.
		certmetrics.CABundlePublished(string(kind), resultError)
		return false, fmt.Errorf("encoding caBundle %s for %s %q: %w", pt, kind, v.name, err)
	}
	opts := metav1.PatchOptions{FieldManager: p.fieldManager}
	if p.ssa {
		opts.Force = new(true)
	}
	err = t.adapter.patch(ctx, v.name, pt, data, opts)
	switch {
	case err == nil:
		p.recordWrite(key, v.resourceVersion, bundle)
		certmetrics.CABundlePublished(string(kind), resultSuccess)
		p.logState(key, "ok", "")
		logger.Info("Published caBundle", "fields", stale, "serverSideApply", p.ssa)
		return true, nil
	case ctx.Err() != nil:
		// Shutting down; the failure says nothing about the target.
		return false, ctx.Err()
	case apierrors.IsNotFound(err):
		// Deleted after it was cached. The informer's delete event queues
		// the target again, which then waits for the object.
		return false, nil
	case apierrors.IsConflict(err):
		// Someone else wrote the object after the cache saw it, or the
		// cache is behind our own previous write. Expected, not an error:
		// the retry works on the newer version.
		certmetrics.CABundlePublished(string(kind), resultConflict)
		logger.V(2).Info("Conflict publishing caBundle, will retry", "err", err)
		return false, fmt.Errorf("publishing caBundle to %s %q: %w", kind, v.name, err)
	default:
		certmetrics.CABundlePublished(string(kind), resultError)
		err = fmt.Errorf("publishing caBundle to %s %q: %w", kind, v.name, err)
		p.logErrorOnce(key, err)
		return false, err
	}
}

// selectedSlots returns the slots of v that any target of kind selects. The
// union across targets matters for server-side apply: an apply releases the
// fields it omits, so two targets applying different subsets of one object
// under the same field manager would undo each other forever.
func (p *Publisher) selectedSlots(kind Kind, v objectView) []slot {
	var out []slot
	for _, s := range v.slots {
		for _, t := range p.targets {
			if t.Kind == kind && t.selects(v.name, v.labels) && t.wantsService(s.service) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// markReady records that t has been published once, and closes the ready
// channel when it was the last one.
func (p *Publisher) markReady(t *targetState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.ready {
		return
	}
	t.ready = true
	p.notReady--
	p.logger.V(1).Info("Target published", "target", t.Target.String())
	if p.notReady == 0 {
		close(p.ready)
		p.logger.Info("caBundle published to every target", "targets", len(p.targets))
	}
}

// recordWrite remembers that the object key, at resourceVersion fromRV, was
// successfully written with bundle.
func (p *Publisher) recordWrite(key, fromRV string, bundle []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.written[key] = writeRecord{fromRV: fromRV, bundle: string(bundle)}
}

// cacheBehindOwnWrite reports whether the cached object at rv is the very
// version our last write of bundle was based on: then the server already has
// the bundle and the write's watch event is on its way. Any other version
// (someone else's write, or our write arriving) ends that state. Objects
// without a resourceVersion (fake clients) are never treated so.
func (p *Publisher) cacheBehindOwnWrite(key, rv string, bundle []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.written[key]
	if !ok || rv == "" {
		return false
	}
	if w.fromRV == rv && w.bundle == string(bundle) {
		return true
	}
	delete(p.written, key)
	return false
}

// forget drops the log and write bookkeeping of an object.
func (p *Publisher) forget(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.logged, key)
	delete(p.written, key)
}

// objectKey identifies one object for the log-once bookkeeping.
func objectKey(kind Kind, name string) string { return string(kind) + "/" + name }

// logState logs msg (at info level) when key enters state, and nothing while
// it stays there, so that a target waiting for hours logs once. Leaving an
// error state for "ok" logs a recovery. An empty msg logs nothing.
func (p *Publisher) logState(key, state, msg string, kv ...any) {
	p.mu.Lock()
	prev, seen := p.logged[key]
	p.logged[key] = state
	p.mu.Unlock()
	if seen && prev == state {
		return
	}
	if msg != "" {
		p.logger.Info(msg, kv...)
	} else if strings.HasPrefix(prev, "error: ") {
		p.logger.Info("caBundle publishing recovered", "object", key)
	}
}

// logErrorOnce logs err unless the last error logged for key had the same
// text: a permanent failure (say, forbidden) retried with backoff logs once,
// not at every retry.
func (p *Publisher) logErrorOnce(key string, err error) {
	state := "error: " + err.Error()
	p.mu.Lock()
	prev := p.logged[key]
	p.logged[key] = state
	p.mu.Unlock()
	if prev != state {
		p.logger.Error(err, "Failed to publish caBundle, will retry with backoff", "object", key)
	}
}
