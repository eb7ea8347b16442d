package sni

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// fetchBatch is how many slots a fetch worker takes at a time: large enough
// that taking work costs nothing beside a parse, small enough that the
// workers finish together.
const fetchBatch = 64

// fetchAll runs the fetch of every slot (reading each provider once, and
// parsing new content) on a bounded pool of workers, and returns the
// results in the slots' order, for apply to take in that order: what the
// controller reports, and the snapshot it builds, are those of a sequential
// refresh, only sooner. The pool has c.fetchWorkers() goroutines, not one
// per provider, and fetchAll returns after all of them stopped. A panic in a
// provider is re-raised on the calling goroutine, as a sequential refresh
// would raise it.
//
// It is for the syncs that read every provider (the first one in
// particular, which parses everything); a sync after a few providers
// notified reads those inline.
func (c *DynamicServingCertificateController) fetchAll(slots []*certSlot, now time.Time) []fetched {
	out := make([]fetched, len(slots))
	workers := min(c.fetchWorkers(), len(slots))
	if workers <= 1 {
		for i, slot := range slots {
			out[i] = slot.fetch(c, now)
		}
		return out
	}
	// Batches of fetchBatch, or smaller so that a small set still spreads
	// over every worker.
	batch := int64(min(fetchBatch, (len(slots)+workers-1)/workers))
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		panicked atomic.Pointer[any]
	)
	for range workers {
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					panicked.CompareAndSwap(nil, &r)
				}
			}()
			for panicked.Load() == nil {
				end := next.Add(batch)
				start := int(end - batch)
				if start >= len(slots) {
					return
				}
				for i := start; i < min(int(end), len(slots)); i++ {
					out[i] = slots[i].fetch(c, now)
				}
			}
		})
	}
	wg.Wait()
	if r := panicked.Load(); r != nil {
		panic(*r)
	}
	return out
}

// fetchWorkers is the size of fetchAll's pool: GOMAXPROCS, the cores the
// process may run on, unless a test set parseWorkers.
func (c *DynamicServingCertificateController) fetchWorkers() int {
	if c.parseWorkers > 0 {
		return c.parseWorkers
	}
	return runtime.GOMAXPROCS(0)
}
