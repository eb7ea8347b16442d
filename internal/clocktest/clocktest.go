// Package clocktest holds fake clocks for tests of the Run loops.
package clocktest

import (
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// RealTimers is clocktesting.FakeClock with one property of real timers the
// fake lacks: a timer for zero or less fires at once, as time.NewTimer(0)
// does, where the fake's waits for the next step. So a Run loop that keeps
// finding work due without the clock moving spins here as it would in
// production. Immediate counts such timers. Safe for concurrent use.
type RealTimers struct {
	*clocktesting.FakeClock
	Immediate atomic.Int64
}

// NewRealTimers returns a RealTimers set to t.
func NewRealTimers(t time.Time) *RealTimers {
	return &RealTimers{FakeClock: clocktesting.NewFakeClock(t)}
}

// NewTimer is the fake clock's timer for d > 0, and one that has already
// fired otherwise.
func (c *RealTimers) NewTimer(d time.Duration) clock.Timer {
	if d > 0 {
		return c.FakeClock.NewTimer(d)
	}
	c.Immediate.Add(1)
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return firedTimer{ch}
}

type firedTimer struct{ c chan time.Time }

func (t firedTimer) C() <-chan time.Time      { return t.c }
func (t firedTimer) Stop() bool               { return false }
func (t firedTimer) Reset(time.Duration) bool { return false }
