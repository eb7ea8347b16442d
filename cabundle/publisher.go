package cabundle

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/errlog"
	"github.com/evercert/evercert/internal/notify"
)

// This file holds the Publisher, its per-target state and its constructor.
// The other concerns have files of their own: configuration (config.go),
// kinds (kind*.go), lifecycle (run.go), the worker (worker.go), writes
// (write.go), contested objects (contest.go, report.go), observation
// (observe.go) and readiness and health (health.go).

const (
	// Retry backoff per target after a failed write (internal/backoff:
	// exponential, jittered, capped, at least a server's Retry-After). The
	// base is short because the common failure, a conflict with a cache
	// that is a few milliseconds behind, resolves almost at once; the cap
	// keeps a forbidden or unreachable API from being hammered while still
	// retrying about twice a minute.
	retryBaseDelay = 100 * time.Millisecond
	retryMaxDelay  = 30 * time.Second
)

// Publisher keeps the caBundle of its targets equal to its source's current
// bundle; see the package documentation for how. Create it with
// [NewPublisher] and start it with [Publisher.Run]. Its methods are safe
// for concurrent use.
//
// A Publisher is a authority.Observer of the bundle it publishes: see
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
	verifiers    []dynamiccert.ServedChainLister

	// queue holds target indexes. A target is the unit of work, so bursts
	// of events about it (bundle change, watch events, resync) coalesce.
	// Retries and contested write-backs are scheduled with AddAfter on the
	// queue's clock.
	queue   workqueue.TypedDelayingInterface[int]
	started atomic.Bool

	// logger is set by Run before any goroutine that reads it starts.
	logger klog.Logger

	// Each concern has one owner, with its own lock:
	//
	// ready tracks which targets have been published to once (health.go).
	ready *readiness
	// logs remembers, by object key (and "source"), the condition last
	// logged, so that a lasting one is logged once.
	logs errlog.ByKey
	// writes remembers each object's last successful write (write.go).
	writes writes
	// contests tracks objects whose caBundle another writer keeps
	// changing (contest.go).
	contests *contests
	// verified tracks the objects whose published bundle does not verify
	// what is served (verify.go).
	verified verifications

	// obsMu guards every targetState.readBack; listeners are notified
	// when one changes (observe.go).
	obsMu     sync.RWMutex
	listeners notify.Listeners
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

	// retry is the backoff after failed writes. Only the worker that holds
	// the target's queue item uses it, and the queue never hands one item
	// to two workers at once.
	retry *backoff.Backoff

	// readBack holds, by object name, what the fields this target selects
	// held when the informer last saw the object; guarded by
	// Publisher.obsMu. Objects with no such field are absent.
	readBack map[string]objectReadBack
}

// NewPublisher validates cfg, builds any missing client and the informers,
// and returns a Publisher that does nothing until Run is called. Errors
// name the offending field of PublisherConfig.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("cabundle: %w", err)
	}
	cfg = cfg.withDefaults()
	p := &Publisher{
		name:         cfg.Name,
		source:       cfg.Source,
		resync:       cfg.Resync,
		ssa:          cfg.UseServerSideApply,
		fieldManager: cfg.FieldManager,
		clock:        cfg.Clock,
		recorder:     cfg.EventRecorder,
		verifiers:    slices.Clone(cfg.Verify),
		logger:       klog.Background(),
		queue:        workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[int]{Clock: cfg.Clock}),
		ready:        newReadiness(len(cfg.Targets)),
		contests:     newContests(cfg.Clock),
	}
	c := &clients{cfg: &cfg}
	adapters := make(map[Kind]*kindAdapter)
	for i, t := range cfg.Targets {
		field := fmt.Sprintf("PublisherConfig.Targets[%d] (%s)", i, t)
		if t.Service != nil {
			// Copy, so the caller cannot change the filter under us.
			svc := *t.Service
			t.Service = &svc
		}
		a, ok := adapters[t.Kind]
		if !ok {
			var err error
			if a, err = kinds[t.Kind](c); err != nil {
				return nil, fmt.Errorf("cabundle: %s: %w", field, err)
			}
			adapters[t.Kind] = a
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
			return nil, fmt.Errorf("cabundle: %s: set informer transform: %w", field, err)
		}
		// The targets slice must be complete before any handler runs
		// (handlers look at the other targets); informers only start in
		// Run, so appending first is enough.
		p.targets = append(p.targets, ts)
		var err error
		if ts.handler, err = ts.informer.AddEventHandler(p.eventHandler(ts)); err != nil {
			return nil, fmt.Errorf("cabundle: %s: add event handler: %w", field, err)
		}
	}
	return p, nil
}
