package cabundle

import (
	"context"
	"sync"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// This file holds the lifecycle of a Publisher: Run starts and stops
// everything, and what queues its targets.

// DefaultWorkers is the number of write workers Run starts when asked for
// none. Targets are few and each write is one request, so a handful is
// plenty; more than one keeps a target whose requests hang (API server
// unreachable) from delaying the others.
const DefaultWorkers = 4

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

// Run starts the informers, workers goroutines that write the targets (at
// most one per target; DefaultWorkers when workers < 1) and the resync
// ticker, and blocks until ctx is done. It then stops everything it started
// and returns once no goroutine of the publisher is left. Logging uses
// klog.FromContext(ctx). Run may be called only once: a second call logs an
// error and returns at once.
func (p *Publisher) Run(ctx context.Context, workers int) {
	if !p.started.CompareAndSwap(false, true) {
		klog.FromContext(ctx).Error(nil, "cabundle: Publisher.Run called more than once; this call does nothing")
		return
	}
	if workers < 1 {
		workers = DefaultWorkers
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
	// A served chain that changes is verified at once.
	for _, v := range p.verifiers {
		if n, ok := v.(dynamiccertificates.Notifier); ok {
			n.AddListener(enqueuer{p})
		}
	}

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
				p.listeners.Notify()
			}
		})
	}
	for range min(len(p.targets), workers) {
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
}
