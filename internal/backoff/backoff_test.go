package backoff

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestBackoffGrowsJittersAndCaps(t *testing.T) {
	b := New(100*time.Millisecond, 2*time.Second)
	err := errors.New("boom")
	prevBase := time.Duration(0)
	for i := range 20 {
		d := b.Next(err)
		base := min(100*time.Millisecond<<i, 2*time.Second)
		if d < base || d >= time.Duration(float64(base)*(1+Jitter))+1 {
			t.Fatalf("step %d: delay %v outside [%v, %v)", i, d, base, time.Duration(float64(base)*(1+Jitter)))
		}
		if d > b.Cap() {
			t.Fatalf("step %d: delay %v above cap %v", i, d, b.Cap())
		}
		if base < prevBase {
			t.Fatalf("step %d: base shrank", i)
		}
		prevBase = base
	}
	b.Reset()
	if d := b.Next(err); d >= 150*time.Millisecond+1 {
		t.Fatalf("after Reset: %v, want the initial delay", d)
	}
}

func TestBackoffHonoursRetryAfter(t *testing.T) {
	b := New(100*time.Millisecond, time.Second)
	err := apierrors.NewTooManyRequests("slow down", 90)
	if d := b.Next(err); d < 90*time.Second {
		t.Fatalf("429 with Retry-After 90s: delay %v, want >= 90s", d)
	}
	// A plain error afterwards is back on the exponential sequence.
	if d := b.Next(errors.New("x")); d > b.Cap() {
		t.Fatalf("delay %v above cap", d)
	}
}

func TestBackoffJitterVaries(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[New(time.Second, time.Minute).Next(nil)] = true
	}
	if len(seen) < 2 {
		t.Fatalf("20 first delays were all equal (%v): no jitter", seen)
	}
}

// TestRetryWaitsOnTheClockUntilSuccess drives Retry on a fake clock: no
// attempt happens before the clock passes the delay failed was told, the
// delays grow, and the first success ends it.
func TestRetryWaitsOnTheClockUntilSuccess(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	attempts := make(chan time.Time, 10)
	var delays []time.Duration
	done := make(chan bool, 1)
	go func() {
		n := 0
		done <- Retry(context.Background(), clk, time.Second, time.Minute, func(context.Context) error {
			attempts <- clk.Now()
			if n++; n <= 3 {
				return errors.New("boom")
			}
			return nil
		}, func(err error, delay time.Duration) { delays = append(delays, delay) })
	}()
	last := <-attempts
	for range 3 {
		// Wait for Retry to sleep on the clock, then wake it exactly at
		// the delay it was told.
		waitForTimer(t, clk)
		d := delays[len(delays)-1]
		clk.Step(d - time.Nanosecond)
		select {
		case at := <-attempts:
			t.Fatalf("attempt at %v, before the delay %v had passed", at.Sub(last), d)
		case <-time.After(50 * time.Millisecond):
		}
		clk.Step(time.Nanosecond)
		last = <-attempts
	}
	if !<-done {
		t.Fatal("Retry reported failure after a successful attempt")
	}
	for i := 1; i < len(delays); i++ {
		if delays[i] <= delays[i-1] {
			t.Errorf("delays %v do not grow", delays)
		}
	}
}

// TestRetryStopsWhenTheContextEnds: a Retry waiting for its next attempt
// returns false at once when ctx ends, and the error of an attempt cut
// short by ctx is not reported as a failure.
func TestRetryStopsWhenTheContextEnds(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	failed := 0
	done := make(chan bool, 1)
	go func() {
		done <- Retry(ctx, clk, time.Second, time.Minute, func(ctx context.Context) error {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errors.New("boom")
		}, func(error, time.Duration) { failed++ })
	}()
	waitForTimer(t, clk)
	cancel()
	select {
	case ok := <-done:
		if ok || failed != 1 {
			t.Errorf("Retry returned %v after %d reported failures, want false after 1", ok, failed)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Retry did not return after its context ended")
	}
}

// waitForTimer waits until something waits on clk.
func waitForTimer(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("Retry never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}
