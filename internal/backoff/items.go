package backoff

import (
	"sync"
	"time"
)

// Items keeps one Backoff per work-queue item, so that each item's retries
// back off on their own. It implements client-go's
// workqueue.TypedRateLimiter[T], so a rate-limiting queue built on it has
// Forget and NumRequeues reach it; callers that know the error use
// NextFor, which honours a Retry-After, and hand the delay to AddAfter.
// Safe for concurrent use.
type Items[T comparable] struct {
	initial, cap time.Duration

	mu    sync.Mutex
	items map[T]*item
}

type item struct {
	backoff  *Backoff
	requeues int
}

// NewItems returns an Items whose every item starts at initial and doubles
// up to cap (the defaults of New when not positive).
func NewItems[T comparable](initial, cap time.Duration) *Items[T] {
	return &Items[T]{initial: initial, cap: cap, items: map[T]*item{}}
}

// NextFor returns how long to wait before retrying key after err (nil for
// a retry without an error, e.g. waiting for something to change).
func (i *Items[T]) NextFor(key T, err error) time.Duration {
	i.mu.Lock()
	defer i.mu.Unlock()
	it := i.items[key]
	if it == nil {
		it = &item{backoff: New(i.initial, i.cap)}
		i.items[key] = it
	}
	it.requeues++
	return it.backoff.Next(err)
}

// When implements workqueue.TypedRateLimiter: NextFor without an error.
func (i *Items[T]) When(key T) time.Duration { return i.NextFor(key, nil) }

// Forget starts key's sequence over (after a success, or when the item is
// gone) and releases its memory.
func (i *Items[T]) Forget(key T) {
	i.mu.Lock()
	defer i.mu.Unlock()
	delete(i.items, key)
}

// NumRequeues returns how many delays key has been handed since it was
// last forgotten.
func (i *Items[T]) NumRequeues(key T) int {
	i.mu.Lock()
	defer i.mu.Unlock()
	if it := i.items[key]; it != nil {
		return it.requeues
	}
	return 0
}
