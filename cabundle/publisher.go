package cabundle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/backoff"
)

const (
	// DefaultResync is the default period of the safety-net re-publish.
	DefaultResync = time.Minute
	// DefaultFieldManager is the default field manager of every write.
	DefaultFieldManager = "evercert"
	// DefaultName is the default name of the publisher as an observer
	// (dynamiccert.Observer) and of its health check.
	DefaultName = "cabundle"

	// Retry backoff per target after a failed write (internal/backoff:
	// exponential, jittered, capped, at least a server's Retry-After). The
	// base is short because the common failure, a conflict with a cache
	// that is a few milliseconds behind, resolves almost at once; the cap
	// keeps a forbidden or unreachable API from being hammered while still
	// retrying about twice a minute.
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
	resultContested = "contested"
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

	// UseServerSideApply writes with server-side apply instead of a JSON
	// patch. The applied object holds only the caBundle fields and, for
	// webhook configurations, the name of each selected webhook, which is
	// the key of the webhooks list. The apply is not forced: a caBundle
	// that another field manager owns is a conflict, reported as contested,
	// and taken over with a forced apply only after the contested backoff
	// (see the package documentation). Note that co-owning the webhook
	// name key has the usual server-side-apply consequence: a webhook the
	// publisher writes into is not removed by another manager's apply that
	// omits it; remove the target first, or delete the webhook with an
	// update or JSON patch.
	UseServerSideApply bool

	// FieldManager is the field manager of every write, in both modes.
	// Empty means DefaultFieldManager ("evercert").
	FieldManager string

	// Name names the publisher as an observer of a CA rotation (its Name
	// method) and its health check. Empty means DefaultName ("cabundle").
	Name string

	// Clock drives every timer of the publisher: the resync ticker, the
	// retry and contested backoffs (through its work queue), and the
	// window in which repeated overwrites make an object contested. Nil
	// means the real clock. A test can pass a fake clock
	// (k8s.io/utils/clock/testing) and step it to drive retries. The
	// informers' own timers (watch restarts) stay on the real clock.
	Clock clock.WithTicker

	// EventRecorder, when set, receives an Event on the object whose
	// caBundle is contested (Warning CABundleContested), forcibly taken
	// over with server-side apply (Warning CABundleForced), and no longer
	// contested (Normal CABundleUncontested). The object is given as an
	// ObjectReference, so the recorder's scheme need not know its kind.
	// Events of cluster-scoped objects land in namespace "default".
	EventRecorder events.EventRecorder
}

// Publisher keeps the caBundle of its targets equal to its source's current
// bundle; see the package documentation for how. Create it with [New] and
// start it with [Publisher.Run]. Its methods are safe for concurrent use.
//
// A Publisher is a dynamiccert.Observer of the bundle it publishes: see
// [Publisher.Observed].
type Publisher struct {
	name         string
	source       dynamiccertificates.CAContentProvider
	targets      []*targetState
	resync       time.Duration
	ssa          bool
	fieldManager string
	clock        clock.WithTicker
	recorder     events.EventRecorder

	// queue holds target indexes. A target is the unit of work, so bursts
	// of events about it (bundle change, watch events, resync) coalesce.
	// Retries and contested write-backs are scheduled with AddAfter on the
	// queue's clock.
	queue   workqueue.TypedDelayingInterface[int]
	started atomic.Bool
	ready   chan struct{}

	// logger is set by Run before any goroutine that reads it starts.
	logger klog.Logger

	// contests tracks objects whose caBundle another writer keeps changing.
	contests *contests

	// obsMu guards every targetState.readBack; listeners are notified
	// when one changes.
	obsMu     sync.RWMutex
	listeners listeners

	mu       sync.Mutex
	notReady int                    // targets not yet published once
	logged   map[string]string      // object key -> last state logged, to log each state once
	written  map[string]writeRecord // object key -> last successful write
}

// targetState is a target with its informer and progress.
type targetState struct {
	Target
	index    int
	adapter  *kindAdapter
	informer cache.SharedIndexInformer
	// handler is the registration of the publisher's event handler; it has
	// synced once the handler saw every object of the initial list, that
	// is once readBack is complete.
	handler cache.ResourceEventHandlerRegistration
	ready   bool // guarded by Publisher.mu

	// retry is the backoff after failed writes. Only the worker that holds
	// the target's queue item uses it, and the queue never hands one item
	// to two workers at once.
	retry *backoff.Backoff

	// readBack holds, by object name, what the fields this target selects
	// held when the informer last saw the object; guarded by
	// Publisher.obsMu. Objects with no such field are absent.
	readBack map[string]objectReadBack
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
		name:         cfg.Name,
		source:       cfg.Source,
		resync:       cfg.Resync,
		ssa:          cfg.UseServerSideApply,
		fieldManager: cfg.FieldManager,
		clock:        cfg.Clock,
		recorder:     cfg.EventRecorder,
		ready:        make(chan struct{}),
		logger:       klog.Background(),
		logged:       make(map[string]string),
		written:      make(map[string]writeRecord),
	}
	if p.name == "" {
		p.name = DefaultName
	}
	if p.resync == 0 {
		p.resync = DefaultResync
	}
	if p.fieldManager == "" {
		p.fieldManager = DefaultFieldManager
	}
	if p.clock == nil {
		p.clock = clock.RealClock{}
	}
	p.queue = workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[int]{Clock: p.clock})
	p.contests = newContests(p.clock)

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
		ts := &targetState{
			Target:   t,
			index:    i,
			adapter:  a,
			informer: a.newInformer(listOptionsFor(t)),
			retry:    backoff.New(retryBaseDelay, retryMaxDelay),
			readBack: make(map[string]objectReadBack),
		}
		if err := ts.informer.SetTransform(a.transform); err != nil {
			return nil, fmt.Errorf("cabundle: target %d (%s): set informer transform: %w", i, t, err)
		}
		// The targets slice must be complete before any handler runs
		// (handlers look at the other targets); informers only start in
		// Run, so appending first is enough.
		p.targets = append(p.targets, ts)
		if ts.handler, err = ts.informer.AddEventHandler(p.eventHandler(ts)); err != nil {
			return nil, fmt.Errorf("cabundle: target %d (%s): add event handler: %w", i, t, err)
		}
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

// Run starts the informers, the workers and the resync ticker and blocks
// until ctx is done. It then stops everything it started and returns nil once
// no goroutine of the publisher is left. Logging uses klog.FromContext(ctx).
// Run may be called only once; a second call returns an error at once.
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
		// others. Its read-back state is complete once the handler has
		// seen the initial list, which observers are told about.
		wg.Go(func() {
			if cache.WaitForCacheSync(ctx.Done(), t.informer.HasSynced, t.handler.HasSynced) {
				p.queue.Add(i)
				p.listeners.notify()
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
		ticker := p.clock.NewTicker(p.resync)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C():
				p.enqueueAll()
			}
		}
	})

	p.logger.V(1).Info("Starting caBundle publisher", "targets", len(p.targets), "serverSideApply", p.ssa, "resync", p.resync)
	<-ctx.Done()
	p.logger.V(1).Info("Stopping caBundle publisher")
	return nil
}
