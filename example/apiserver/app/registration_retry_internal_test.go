package app

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorfake "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/backoff"
)

// apiServiceReads records, on the fake clock, when the registration reads
// the APIService, answering with err while it is set.
type apiServiceReads struct {
	clk *clocktesting.FakeClock
	mu  sync.Mutex
	at  []time.Time
	err error
}

func (a *apiServiceReads) react(k8stesting.Action) (bool, runtime.Object, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at = append(a.at, a.clk.Now())
	return a.err != nil, nil, a.err
}

func (a *apiServiceReads) setErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err = err
}

func (a *apiServiceReads) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at...)
}

// ensuring is one ensureUntilDone running in the background.
type ensuring struct {
	finished chan struct{} // closed when it returned
	ok       bool          // what it returned; read after finished
}

func (e *ensuring) done() bool {
	select {
	case <-e.finished:
		return true
	default:
		return false
	}
}

func testRegistration(t *testing.T, client *aggregatorfake.Clientset) *registration {
	t.Helper()
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: "serving"})
	require.NoError(t, err)
	return &registration{client: client, namespace: "ns", name: "svc", port: 443, source: serving}
}

// startEnsuring runs ensureUntilDone on a fake clock against a client whose
// GETs of the APIService it records.
func startEnsuring(t *testing.T, err error) (*apiServiceReads, *clocktesting.FakeClock, *ensuring) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	reads := &apiServiceReads{clk: clk, err: err}
	client := aggregatorfake.NewClientset()
	client.PrependReactor("get", "apiservices", reads.react)
	r := testRegistration(t, client)
	r.clock = clk
	ctx, cancel := context.WithCancel(context.Background())
	e := &ensuring{finished: make(chan struct{})}
	go func() {
		defer close(e.finished)
		e.ok = r.ensureUntilDone(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-e.finished:
		case <-time.After(30 * time.Second):
			t.Error("ensureUntilDone did not return after its context ended")
		}
	})
	waitEnsureIdle(t, clk, e)
	return reads, clk, e
}

// waitEnsureIdle waits until the loop sleeps on the clock or has returned.
// The 30 s guard is no timing assertion: the loop gets there long before.
func waitEnsureIdle(t *testing.T, clk *clocktesting.FakeClock, e *ensuring) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !clk.HasWaiters() && !e.done() {
		if time.Now().After(deadline) {
			t.Fatal("ensureUntilDone neither waits on the clock nor returned")
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// TestRegistrationBacksOffWithJitter fails the APIService GET for five
// simulated minutes, stepping the clock by 100 ms: the gaps between attempts
// follow internal/backoff (doubling from registrationBaseDelay, capped at
// registrationMaxDelay, each lengthened by up to 50% at random), and the
// loop succeeds once the API does.
func TestRegistrationBacksOffWithJitter(t *testing.T) {
	const step = 100 * time.Millisecond
	reads, clk, e := startEnsuring(t, apierrors.NewForbidden(apiregistrationv1.Resource("apiservices"), APIServiceName, errors.New("RBAC")))
	start := clk.Now()
	for clk.Since(start) < 5*time.Minute {
		clk.Step(step)
		waitEnsureIdle(t, clk, e)
	}
	require.False(t, e.done(), "registration cannot succeed while the API fails")

	at := reads.times()
	require.Greater(t, len(at), 10)
	base, jittered := registrationBaseDelay, 0
	for i := 1; i < len(at); i++ {
		gap := at[i].Sub(at[i-1])
		// A timer fires at the first step at or after its end.
		assert.GreaterOrEqual(t, gap, base, "gap %d", i)
		assert.Less(t, gap, time.Duration(float64(base)*(1+backoff.Jitter))+step, "gap %d", i)
		if gap > base+step {
			jittered++
		}
		base = min(2*base, registrationMaxDelay)
	}
	assert.Equal(t, registrationMaxDelay, base, "the backoff reached its cap")
	assert.Positive(t, jittered, "no gap was lengthened by jitter")

	reads.setErr(nil)
	for !e.done() {
		require.LessOrEqual(t, clk.Since(start), 6*time.Minute, "no success within one capped delay of the API recovering")
		clk.Step(step)
		waitEnsureIdle(t, clk, e)
	}
	assert.True(t, e.ok)
}

// TestRegistrationHonoursRetryAfter answers with 429 and Retry-After: 60 s;
// the next attempt comes no earlier.
func TestRegistrationHonoursRetryAfter(t *testing.T) {
	reads, clk, e := startEnsuring(t, apierrors.NewTooManyRequests("slow down", 60))
	require.Len(t, reads.times(), 1)
	for range 59 {
		clk.Step(time.Second)
		waitEnsureIdle(t, clk, e)
	}
	require.Len(t, reads.times(), 1, "retried before Retry-After")
	reads.setErr(nil)
	clk.Step(time.Second)
	waitEnsureIdle(t, clk, e)
	assert.Len(t, reads.times(), 2)
	require.True(t, e.done())
	assert.True(t, e.ok)
}

// TestRegistrationConcurrentWriters: a conflict on update, or AlreadyExists
// on create (another replica wrote first), is re-read and decided again,
// not returned as an error.
func TestRegistrationConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	failFirst := func(client *aggregatorfake.Clientset, verb string, n int, err error) {
		client.PrependReactor(verb, "apiservices", func(k8stesting.Action) (bool, runtime.Object, error) {
			if n > 0 {
				n--
				return true, nil, err
			}
			return false, nil, nil
		})
	}
	gets := func(client *aggregatorfake.Clientset) (n int) {
		for _, a := range client.Actions() {
			if a.GetVerb() == "get" {
				n++
			}
		}
		return n
	}

	t.Run("conflict on update", func(t *testing.T) {
		client := aggregatorfake.NewClientset(DesiredAPIService("other", "svc", 8443, []byte("stale")))
		failFirst(client, "update", 2, apierrors.NewConflict(apiregistrationv1.Resource("apiservices"), APIServiceName, errors.New("modified")))
		r := testRegistration(t, client)
		require.NoError(t, r.ensure(ctx))
		assert.Equal(t, 3, gets(client), "each conflict is re-read")
		got, err := client.ApiregistrationV1().APIServices().Get(ctx, APIServiceName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "ns", got.Spec.Service.Namespace)
	})

	t.Run("already exists on create", func(t *testing.T) {
		client := aggregatorfake.NewClientset()
		failFirst(client, "create", 1, apierrors.NewAlreadyExists(apiregistrationv1.Resource("apiservices"), APIServiceName))
		r := testRegistration(t, client)
		require.NoError(t, r.ensure(ctx))
		assert.Equal(t, 2, gets(client), "AlreadyExists is re-read")
	})

	t.Run("a persistent conflict is an error", func(t *testing.T) {
		client := aggregatorfake.NewClientset(DesiredAPIService("other", "svc", 8443, []byte("stale")))
		failFirst(client, "update", 100, apierrors.NewConflict(apiregistrationv1.Resource("apiservices"), APIServiceName, errors.New("modified")))
		r := testRegistration(t, client)
		err := r.ensure(ctx)
		require.ErrorContains(t, err, "changed while being updated")
		assert.True(t, apierrors.IsConflict(err), "the conflict stays visible to the caller: %v", err)
	})
}
