package backoff

import (
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
