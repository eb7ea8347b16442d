package notify

import (
	"sync"
	"sync/atomic"
	"testing"
)

type counter struct{ n atomic.Int32 }

func (c *counter) Enqueue() { c.n.Add(1) }

func TestNotifyTellsEveryListenerOfEveryChange(t *testing.T) {
	var l Listeners
	l.Notify() // no listener yet: nothing to do, no panic
	a, b := &counter{}, &counter{}
	l.Add(a)
	l.Notify()
	l.Add(b)
	l.Notify()
	if a.n.Load() != 2 || b.n.Load() != 1 {
		t.Errorf("a notified %d times, b %d times; want 2 and 1", a.n.Load(), b.n.Load())
	}
}

// adder adds a listener from inside Enqueue, which must not deadlock.
type adder struct {
	l     *Listeners
	added atomic.Bool
}

func (a *adder) Enqueue() {
	if a.added.CompareAndSwap(false, true) {
		a.l.Add(&counter{})
	}
}

func TestListenerMayAddAListenerWhileNotified(t *testing.T) {
	var l Listeners
	l.Add(&adder{l: &l})
	l.Notify()
	l.Notify()
}

func TestConcurrentAddAndNotify(t *testing.T) {
	var l Listeners
	c := &counter{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				l.Add(c)
				l.Notify()
			}
		})
	}
	wg.Wait()
	if c.n.Load() == 0 {
		t.Error("no listener was notified")
	}
}
