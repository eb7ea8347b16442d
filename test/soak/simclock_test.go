//go:build soak

package soak

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// simClock is the one fake clock of a scenario, together with the
// bookkeeping that tells the harness when every loop waits on it again
// after a step. Components never get the fake clock itself: each gets an
// offsetClock (its own view, shifted by a skew) whose timers and tickers
// are tracked here.
//
// Only the test goroutine steps the clock. A step and the creation, stop or
// reset of a timer are serialized by mu, so "fired" is exact: a timer fired
// iff a step reached its deadline after it was armed.
type simClock struct {
	base *clocktesting.FakeClock

	mu      sync.Mutex
	timers  map[*simTimer]struct{}  // armed timers
	tickers map[*simTicker]struct{} // running tickers
	// pending counts, per strict owner, the wakes (a timer fired or was
	// stopped) not yet followed by a new wait (a new or reset timer). A
	// strict owner is a loop that always waits on a timer again after it
	// woke (SelfSigned.Run, Authority.Run), so pending 0 means it is back
	// to waiting on the clock.
	pending map[string]int
	strict  map[string]bool
	// ops counts every timer operation, as activity for settle.
	ops atomic.Int64
}

func newSimClock(start time.Time) *simClock {
	return &simClock{
		base:    clocktesting.NewFakeClock(start),
		timers:  map[*simTimer]struct{}{},
		tickers: map[*simTicker]struct{}{},
		pending: map[string]int{},
		strict:  map[string]bool{},
	}
}

// Now is the true (unskewed) simulated time.
func (s *simClock) Now() time.Time { return s.base.Now() }

// view returns owner's clock: the base clock shifted by offset. A strict
// owner counts as busy until it first waits on the clock.
func (s *simClock) view(owner string, offset time.Duration, strict bool) *offsetClock {
	s.mu.Lock()
	defer s.mu.Unlock()
	if strict {
		s.strict[owner] = true
		s.pending[owner] = 1 // not waiting yet
	}
	return &offsetClock{sim: s, owner: owner, offset: offset}
}

// forget drops owner's bookkeeping: its loop stopped (crash, teardown).
func (s *simClock) forget(owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.strict, owner)
	delete(s.pending, owner)
	for t := range s.timers {
		if t.c.owner == owner {
			delete(s.timers, t)
		}
	}
	for t := range s.tickers {
		if t.c.owner == owner {
			delete(s.tickers, t)
		}
	}
}

// step moves the clock by d and marks every timer that fired.
func (s *simClock) step(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.base.Step(d)
	now := s.base.Now()
	for t := range s.timers {
		if !t.deadline.After(now) {
			delete(s.timers, t)
			t.state = timerFired
			if s.strict[t.c.owner] {
				s.pending[t.c.owner]++
			}
		}
	}
	for t := range s.tickers {
		for !t.next.After(now) {
			t.next = t.next.Add(t.interval)
		}
	}
	s.ops.Add(1)
}

// busy says which owner is not waiting on the clock, or "" when all are:
// no tick is left unconsumed and every strict owner waits on a timer.
func (s *simClock) busy() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t := range s.tickers {
		if len(t.inner.C()) > 0 {
			return t.c.owner + ": tick not consumed"
		}
	}
	var owners []string
	for o, n := range s.pending {
		if n > 0 {
			owners = append(owners, o)
		}
	}
	if len(owners) > 0 {
		sort.Strings(owners)
		return strings.Join(owners, ", ") + ": woken, not waiting on the clock again"
	}
	return ""
}

// due reports whether an armed timer's deadline has come: a real timer
// would have fired already; the fake one waits for the next step.
func (s *simClock) due() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.base.Now()
	for t := range s.timers {
		if !t.deadline.After(now) {
			return true
		}
	}
	return false
}

// dueOwners lists the owners of due timers.
func (s *simClock) dueOwners() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.base.Now()
	var out []string
	for t := range s.timers {
		if !t.deadline.After(now) && !slices.Contains(out, t.c.owner) {
			out = append(out, t.c.owner)
		}
	}
	slices.Sort(out)
	return out
}

// nextDeadline is the earliest time a timer or ticker fires; zero if none.
func (s *simClock) nextDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var next time.Time
	for t := range s.timers {
		if next.IsZero() || t.deadline.Before(next) {
			next = t.deadline
		}
	}
	for t := range s.tickers {
		if next.IsZero() || t.next.Before(next) {
			next = t.next
		}
	}
	return next
}

// describe lists armed timers and tickers by owner, for diagnostics.
func (s *simClock) describe() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.base.Now()
	var lines []string
	for t := range s.timers {
		lines = append(lines, fmt.Sprintf("timer %s in %v", t.c.owner, t.deadline.Sub(now)))
	}
	for t := range s.tickers {
		lines = append(lines, fmt.Sprintf("ticker %s every %v (pending tick %v)", t.c.owner, t.interval, len(t.inner.C()) > 0))
	}
	for o, n := range s.pending {
		if n > 0 {
			lines = append(lines, fmt.Sprintf("owner %s: %d wakes pending", o, n))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "; ")
}

// offsetClock is one component's view of the simulated clock: Now is the
// base time plus offset (a skewed replica). Durations are relative, so
// timers and tickers delegate to the base clock; they are tracked by the
// simClock.
type offsetClock struct {
	sim    *simClock
	owner  string
	offset time.Duration
}

var _ clock.WithTicker = (*offsetClock)(nil)

func (c *offsetClock) Now() time.Time                  { return c.sim.base.Now().Add(c.offset) }
func (c *offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *offsetClock) After(d time.Duration) <-chan time.Time {
	return c.NewTimer(d).C()
}
func (c *offsetClock) Sleep(d time.Duration) { <-c.NewTimer(d).C() }
func (c *offsetClock) Tick(d time.Duration) <-chan time.Time {
	if d <= 0 {
		return nil
	}
	return c.NewTicker(d).C()
}

func (c *offsetClock) NewTimer(d time.Duration) clock.Timer {
	s := c.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &simTimer{c: c, inner: s.base.NewTimer(d), deadline: s.base.Now().Add(d)}
	s.armLocked(t, true)
	return t
}

func (c *offsetClock) NewTicker(d time.Duration) clock.Ticker {
	s := c.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &simTicker{c: c, inner: s.base.NewTicker(d), interval: d, next: s.base.Now().Add(d)}
	s.tickers[t] = struct{}{}
	s.ops.Add(1)
	return t
}

// armLocked records that t waits. wake says the owner waits anew (it
// consumed a wake).
func (s *simClock) armLocked(t *simTimer, wake bool) {
	t.state = timerArmed
	s.timers[t] = struct{}{}
	if wake && s.strict[t.c.owner] && s.pending[t.c.owner] > 0 {
		s.pending[t.c.owner]--
	}
	s.ops.Add(1)
}

type timerState int

const (
	timerArmed timerState = iota
	timerFired
	timerStopped
)

type simTimer struct {
	c        *offsetClock
	inner    clock.Timer
	deadline time.Time // base time
	state    timerState
}

func (t *simTimer) C() <-chan time.Time { return t.inner.C() }

func (t *simTimer) Stop() bool {
	s := t.c.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.state == timerArmed {
		delete(s.timers, t)
		t.state = timerStopped
		if s.strict[t.c.owner] {
			// The loop woke for another reason (an event) and will wait
			// again once it has handled it.
			s.pending[t.c.owner]++
		}
	}
	s.ops.Add(1)
	return t.inner.Stop()
}

func (t *simTimer) Reset(d time.Duration) bool {
	s := t.c.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	wasArmed := t.state == timerArmed
	active := t.inner.Reset(d)
	t.deadline = s.base.Now().Add(d)
	s.armLocked(t, !wasArmed)
	return active
}

type simTicker struct {
	c        *offsetClock
	inner    clock.Ticker
	interval time.Duration
	next     time.Time // base time of the next tick
}

func (t *simTicker) C() <-chan time.Time { return t.inner.C() }

func (t *simTicker) Stop() {
	s := t.c.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tickers, t)
	s.ops.Add(1)
	t.inner.Stop() // a no-op on the fake clock: its waiter stays, harmlessly
}

// settleSpec says what settleLoops waits for.
type settleSpec struct {
	sim *simClock
	// what names the scenario and time in messages.
	what func() string
	// activity counts everything the loops do; settled means unchanged
	// for the quiet window.
	activity func() int64
	// notSettled says what is not in its steady state yet, "" when all is.
	notSettled func() string
	// hotLoop is called once when loops keep re-arming due timers; they
	// then wait for the next step.
	hotLoop func()
	// describe adds context to a timeout.
	describe func() string
}

// maxZeroSteps is how many due timers in a row one settle fires before it
// calls the loops that re-arm them a hot loop.
const maxZeroSteps = 100

// settleLoops waits until every loop on s.sim waits on the clock again,
// nothing else is pending and nothing happened for -soak.quiet. It fires
// timers that are already due (a real clock would), and fails the test
// after -soak.settle-timeout of real time.
func settleLoops(t testing.TB, s settleSpec) {
	t.Helper()
	began := time.Now()
	deadline := began.Add(*settleTimeout)
	zeroSteps, spinning := 0, false
	var quietSince time.Time
	last := int64(-1)
	lastWhy := ""
	defer func() {
		if d := time.Since(began); d > time.Second {
			t.Logf("%s: settling took %v (last waiting for: %s)", s.what(), d.Round(time.Millisecond), lastWhy)
		}
	}()
	for {
		act := s.activity() + s.sim.ops.Load()
		why := s.notSettled() // first: it may stop crashed loops
		if why == "" {
			why = s.sim.busy()
		}
		if why == "" && !spinning && s.sim.due() {
			// A loop waits on a timer that is due now (a zero or negative
			// wait): a real clock fires it at once, so does a zero step.
			// A loop that keeps doing so spins on a real clock: a hot
			// loop.
			if zeroSteps++; zeroSteps > maxZeroSteps {
				spinning = true
				if s.hotLoop != nil {
					s.hotLoop()
				}
			} else {
				s.sim.step(0)
				quietSince, last = time.Time{}, -1
				continue
			}
		}
		if why != "" {
			lastWhy = why
		} else if act != last {
			lastWhy = "activity"
		}
		switch {
		case why != "" || act != last:
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) >= *quietWindow:
			return
		}
		last = act
		if time.Now().After(deadline) {
			extra := ""
			if s.describe != nil {
				extra = "\n" + s.describe()
			}
			t.Fatalf("%s: loops did not settle within %v: %s\nclock: %s%s", s.what(), *settleTimeout, why, s.sim.describe(), extra)
		}
		time.Sleep(500 * time.Microsecond)
	}
}
