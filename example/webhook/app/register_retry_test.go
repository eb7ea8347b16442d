package app

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/backoff"
)

// registerAttempts records, on the fake clock, when registerUntilDoneOn
// reads the validating configuration, answering with err while it is set.
type registerAttempts struct {
	clk *clocktesting.FakeClock
	mu  sync.Mutex
	at  []time.Time
	err error
}

func (a *registerAttempts) react(clienttesting.Action) (bool, runtime.Object, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at = append(a.at, a.clk.Now())
	return a.err != nil, nil, a.err
}

func (a *registerAttempts) setErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err = err
}

func (a *registerAttempts) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at...)
}

// registering is one registerUntilDoneOn running in the background.
type registering struct {
	finished chan struct{} // closed when it returned
	ok       bool          // what it returned; read after finished
}

func (r *registering) done() bool {
	select {
	case <-r.finished:
		return true
	default:
		return false
	}
}

// startRegistering runs registerUntilDoneOn on a fake clock against a
// client whose GETs of the validating configuration it records.
func startRegistering(t *testing.T, err error) (*registerAttempts, *clocktesting.FakeClock, *registering) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	attempts := &registerAttempts{clk: clk, err: err}
	client := fake.NewClientset()
	client.PrependReactor("get", "validatingwebhookconfigurations", attempts.react)
	reg := Registration{BaseURL: "https://127.0.0.1:8443", Validating: "v"}
	ctx, cancel := context.WithCancel(context.Background())
	done := &registering{finished: make(chan struct{})}
	go func() {
		defer close(done.finished)
		done.ok = reg.registerUntilDoneOn(ctx, clk, client, func() []byte { return []byte("bundle") })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done.finished:
		case <-time.After(30 * time.Second):
			t.Error("registerUntilDoneOn did not return after its context ended")
		}
	})
	waitIdle(t, clk, done)
	return attempts, clk, done
}

// waitIdle waits until the loop sleeps on the clock or has returned. The
// 30 s guard is no timing assertion: the loop gets there long before.
func waitIdle(t *testing.T, clk *clocktesting.FakeClock, done *registering) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !clk.HasWaiters() && !done.done() {
		if time.Now().After(deadline) {
			t.Fatal("registerUntilDoneOn neither waits on the clock nor returned")
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// TestRegisterUntilDoneBacksOffWithJitter fails registration for five
// simulated minutes, stepping the clock by 100 ms: the gaps between attempts
// follow internal/backoff (doubling from 200 ms, capped at 30 s, each
// lengthened by up to 50% at random), and the loop succeeds once the API
// does.
func TestRegisterUntilDoneBacksOffWithJitter(t *testing.T) {
	const step = 100 * time.Millisecond
	attempts, clk, done := startRegistering(t, apierrors.NewForbidden(admissionregistrationv1.Resource("validatingwebhookconfigurations"), "v", errors.New("RBAC")))
	start := clk.Now()
	for clk.Since(start) < 5*time.Minute {
		clk.Step(step)
		waitIdle(t, clk, done)
	}
	require.False(t, done.done(), "registration cannot succeed while the API fails")

	at := attempts.times()
	require.Greater(t, len(at), 10)
	base, jittered := registerInitialDelay, 0
	for i := 1; i < len(at); i++ {
		gap := at[i].Sub(at[i-1])
		// A timer fires at the first step at or after its end.
		assert.GreaterOrEqual(t, gap, base, "gap %d", i)
		assert.Less(t, gap, time.Duration(float64(base)*(1+backoff.Jitter))+step, "gap %d", i)
		if gap > base+step {
			jittered++
		}
		base = min(2*base, registerMaxDelay)
	}
	assert.Equal(t, registerMaxDelay, base, "the backoff reached its cap")
	assert.Positive(t, jittered, "no gap was lengthened by jitter")

	attempts.setErr(nil)
	for !done.done() {
		require.LessOrEqual(t, clk.Since(start), 6*time.Minute, "no success within one capped delay of the API recovering")
		clk.Step(step)
		waitIdle(t, clk, done)
	}
	assert.True(t, done.ok)
}

// TestRegisterUntilDoneHonoursRetryAfter answers with 429 and Retry-After:
// 60 s; the next attempt comes no earlier.
func TestRegisterUntilDoneHonoursRetryAfter(t *testing.T) {
	attempts, clk, done := startRegistering(t, apierrors.NewTooManyRequests("slow down", 60))
	require.Len(t, attempts.times(), 1)
	for range 59 {
		clk.Step(time.Second)
		waitIdle(t, clk, done)
	}
	require.Len(t, attempts.times(), 1, "retried before Retry-After")
	attempts.setErr(nil)
	clk.Step(time.Second)
	waitIdle(t, clk, done)
	assert.Len(t, attempts.times(), 2)
	require.True(t, done.done())
	assert.True(t, done.ok)
}
