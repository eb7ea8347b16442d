package backoff

import (
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
)

var _ workqueue.TypedRateLimiter[string] = &Items[string]{}

// TestItemsBackOffPerItem: each item has its own sequence; Forget starts
// one over without touching the others; Retry-After is honoured.
func TestItemsBackOffPerItem(t *testing.T) {
	it := NewItems[string](100*time.Millisecond, time.Second)
	err := errors.New("boom")
	for range 4 {
		it.NextFor("a", err)
	}
	// The fifth delay is min(100ms*2^4, 1s) = 1s, plus jitter.
	if d := it.NextFor("a", err); d < time.Second {
		t.Fatalf("a's fifth delay %v did not grow to the cap", d)
	}
	if d := it.When("b"); d >= 150*time.Millisecond+1 {
		t.Fatalf("b's first delay %v: items share a sequence", d)
	}
	if n := it.NumRequeues("a"); n != 5 {
		t.Fatalf("NumRequeues(a) = %d, want 5", n)
	}
	it.Forget("a")
	if n := it.NumRequeues("a"); n != 0 {
		t.Fatalf("NumRequeues(a) after Forget = %d", n)
	}
	if d := it.NextFor("a", err); d >= 150*time.Millisecond+1 {
		t.Fatalf("after Forget: %v, want the initial delay", d)
	}
	if n := it.NumRequeues("b"); n != 1 {
		t.Fatalf("Forget(a) touched b: NumRequeues(b) = %d", n)
	}
	if d := it.NextFor("c", apierrors.NewTooManyRequests("slow down", 30)); d < 30*time.Second {
		t.Fatalf("429 with Retry-After 30s: delay %v", d)
	}
}
