package authority

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
	"github.com/evercert/evercert/internal/klogtest"
)

// guard bounds every wait for another goroutine. It is not a timing
// assertion: on success the condition holds long before it.
//
// The longest tests of the package wait on goroutines far more than they
// compute (fake clocks, watches), and run side by side (t.Parallel, marked
// "see guard"): under the race detector the package took most of make
// test-unit's time one test at a time. A test joins them only if it keeps
// to its own clientset and clock, sets no package variable (mutations)
// and asserts no metric or log, which a neighbour could move.
const guard = 30 * time.Second

// apiCalls counts the calls of one verb on secrets and answers them with an
// error while one is set.
type apiCalls struct {
	n   atomic.Int64
	mu  sync.Mutex
	err error
}

func (c *apiCalls) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
}

func interceptSecrets(client *fake.Clientset, verb string, err error) *apiCalls {
	c := &apiCalls{err: err}
	client.PrependReactor(verb, "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		c.n.Add(1)
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err != nil, nil, c.err
	})
	return c
}

// quietWatch makes the watch deliver no events, so that the Secret the
// Authority writes does not kick its loop: the only kicks are the test's.
func quietWatch(client *fake.Clientset) {
	client.PrependWatchReactor("secrets", func(clienttesting.Action) (bool, watch.Interface, error) {
		return true, watch.NewFake(), nil
	})
}

// secretWatches counts the Secret watches made on client, for a test that
// must not change the Secret before the watch is there: the fake
// clientset's watch starts when it is made, and a change before that is
// never delivered (a real API server's watch resumes from the list's
// resourceVersion).
func secretWatches(client *fake.Clientset) *atomic.Int32 {
	var n atomic.Int32
	client.PrependWatchReactor("secrets", func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return true, nil, err
		}
		n.Add(1)
		return true, w, nil
	})
	return &n
}

func forbidden() error {
	return apierrors.NewForbidden(corev1.Resource("secrets"), "ca", errors.New("RBAC: access denied"))
}

// runInBackground runs run until the test ends.
func runInBackground(t *testing.T, run func(context.Context, int)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, 1)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(guard):
			t.Error("Run did not return after its context ended")
		}
	})
}

// waitBlocked waits until the run loop sleeps on the fake clock: it is the
// clock's only user, so a waiter means the loop finished its pass.
func waitBlocked(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	waitFor(t, "the run loop to wait on the clock", clk.HasWaiters)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// stepSeconds steps the clock n times by one second, letting the loop finish
// its pass after each step.
func stepSeconds(t *testing.T, clk *clocktesting.FakeClock, n int) {
	t.Helper()
	for range n {
		clk.Step(time.Second)
		waitBlocked(t, clk)
	}
}

// attemptsWithin is how many attempts a loop makes in window on a clock
// stepped by step, its first attempt at 0 and every later one after a
// backoff.DefaultInitial..DefaultCap delay stretched by stretch (1: no
// jitter, 1+backoff.Jitter: the most jitter). A timer fires at the first
// step at or after its end, so each wait is rounded up to whole steps.
func attemptsWithin(window, step time.Duration, stretch float64) int {
	n, at, d := 1, time.Duration(0), backoff.DefaultInitial
	for {
		wait := time.Duration(float64(d) * stretch)
		at += (wait + step - 1) / step * step
		if at > window {
			return n
		}
		n++
		d = min(2*d, backoff.DefaultCap)
	}
}

// TestAuthorityRunBacksOffOnAPIErrors runs the Authority against an API
// server that answers every GET and list with Forbidden, for ten simulated
// minutes in one-second steps. Retries must follow the backoff (doubling
// from 800 ms to 30 s, with jitter), not one per step; the GET's failure,
// the same at every attempt, is counted once in the load-error metric and
// logged once, and once more when no read succeeded for secretReadsMaxAge
// (the watch delivers nothing): then the replica cannot see the Secret
// change, a second condition reported once (issue 27). The watch's own
// failure is counted once more.
func TestAuthorityRunBacksOffOnAPIErrors(t *testing.T) {
	client := fake.NewClientset()
	gets := interceptSecrets(client, "get", forbidden())
	// A list that succeeds would show the Secret absent and let the
	// replica create it from the watch's cache (TestGetForbiddenWatchAllowed).
	interceptSecrets(client, "list", forbidden())
	clk := clocktesting.NewFakeClock(testNow)
	a := newTestAuthority(t, client, clk, "authority-run-backoff")
	logs := klogtest.Capture(t)
	before := certmetricstest.LoadErrors(t, a.Name())

	runInBackground(t, a.Run)
	waitBlocked(t, clk)
	require.EqualValues(t, 1, gets.n.Load())
	const window = 10 * time.Minute
	stepSeconds(t, clk, int(window/time.Second))

	n := int(gets.n.Load())
	most, least := attemptsWithin(window, time.Second, 1), attemptsWithin(window, time.Second, 1+backoff.Jitter)
	assert.LessOrEqual(t, n, most, "GETs in %v of 1s steps: more than the backoff allows", window)
	assert.GreaterOrEqual(t, n, least, "GETs in %v: the loop must keep retrying at the cap", window)
	assert.EqualValues(t, 3, certmetricstest.LoadErrors(t, a.Name())-before, "%d attempts of one failure are one load error, the stale read one more, the watch's failure one more", n)
	assert.Equal(t, 2, logs.Count("Rejected new content", "reading CA secret ns/ca: forbidden"), "one log line for one distinct error, and one once stale")
	assert.Equal(t, 1, logs.Count("Rejected new content", "stale watch"), "one log line for the stale read")
	require.ErrorContains(t, a.LastError(), "reading CA secret ns/ca: forbidden")
	assert.Nil(t, a.Leaf())
}

// TestAuthorityRunHonoursRetryAfter answers GETs with 429 and Retry-After:
// 120 s. The loop must not GET again before 120 s have passed on its clock,
// and must retry then.
func TestAuthorityRunHonoursRetryAfter(t *testing.T) {
	const retryAfter = 120
	client := fake.NewClientset()
	gets := interceptSecrets(client, "get", apierrors.NewTooManyRequests("slow down", retryAfter))
	interceptSecrets(client, "list", forbidden()) // GETs are the only read
	clk := clocktesting.NewFakeClock(testNow)
	a := newTestAuthority(t, client, clk, "authority-run-retry-after")

	runInBackground(t, a.Run)
	waitBlocked(t, clk)
	require.EqualValues(t, 1, gets.n.Load())
	for i := 1; i < retryAfter; i++ {
		stepSeconds(t, clk, 1)
		require.EqualValues(t, 1, gets.n.Load(), "GET again %ds after a 429 with Retry-After %ds", i, retryAfter)
	}
	stepSeconds(t, clk, 1)
	assert.EqualValues(t, 2, gets.n.Load(), "retry once Retry-After has passed")
	assert.ErrorContains(t, a.LastError(), "slow down")
}

// TestAuthorityRunRecoversAndResetsBackoff lets the backoff grow, then lets
// GETs succeed: the Authority serves within the pending backoff delay.
// After that success the backoff starts over, and a watch event while
// healthy reconciles at once.
func TestAuthorityRunRecoversAndResetsBackoff(t *testing.T) {
	client := fake.NewClientset()
	quietWatch(client)
	gets := interceptSecrets(client, "get", forbidden())
	interceptSecrets(client, "list", forbidden()) // GETs are the only read
	clk := clocktesting.NewFakeClock(testNow)
	a := newTestAuthority(t, client, clk, "authority-run-recover")

	runInBackground(t, a.Run)
	waitBlocked(t, clk)
	// Six failed attempts: the five waits between them double from 800 ms,
	// so they take at least 0.8+1.6+3.2+6.4+12.8 s.
	const failures = 6
	start := clk.Now()
	for gets.n.Load() < failures {
		stepSeconds(t, clk, 1)
	}
	require.EqualValues(t, failures, gets.n.Load())
	assert.GreaterOrEqual(t, clk.Since(start), 24800*time.Millisecond, "%d attempts came faster than the backoff allows", failures)

	// The pending delay is 800ms * 2^5 = 25.6 s plus up to 50% jitter.
	gets.fail(nil)
	pending := time.Duration(float64(backoff.DefaultInitial<<(failures-1)) * (1 + backoff.Jitter))
	start = clk.Now()
	for a.Leaf() == nil {
		require.LessOrEqual(t, clk.Since(start), pending, "not serving within the pending backoff delay")
		stepSeconds(t, clk, 1)
	}
	assert.EqualValues(t, failures+1, gets.n.Load(), "one GET recovers")
	assert.NoError(t, a.LastError())

	// Healthy: an event reconciles at once, without the clock moving.
	gets.fail(forbidden())
	a.Enqueue()
	waitFor(t, "the event to cause a GET", func() bool { return gets.n.Load() == failures+2 })
	waitBlocked(t, clk)
	require.Error(t, a.LastError())
	// The backoff started over: the first retry comes after 0.8-1.2 s, not
	// after the 30 s the earlier failures had reached.
	stepSeconds(t, clk, 2)
	assert.EqualValues(t, failures+3, gets.n.Load(), "the backoff did not reset after the success")
}

// TestAuthorityRunKickDuringBackoff sends watch events while the loop backs
// off: none of them may cause a GET before the backoff ends, and together
// they cause no extra GET after it.
func TestAuthorityRunKickDuringBackoff(t *testing.T) {
	client := fake.NewClientset()
	gets := interceptSecrets(client, "get", forbidden())
	interceptSecrets(client, "list", forbidden()) // GETs are the only read
	clk := clocktesting.NewFakeClock(testNow)
	a := newTestAuthority(t, client, clk, "authority-run-kick")

	runInBackground(t, a.Run)
	// Another loop (the Secret's watch) may wait on the clock before the
	// first check has made its GET: wait for that GET, then for the wait.
	waitFor(t, "the first GET", func() bool { return gets.n.Load() >= 1 })
	waitBlocked(t, clk)
	require.EqualValues(t, 1, gets.n.Load())
	// The first delay is at least 800 ms: 7 steps of 100 ms stay inside it.
	for range 7 {
		for range 10 {
			a.Enqueue()
		}
		clk.Step(100 * time.Millisecond)
		waitBlocked(t, clk)
	}
	assert.EqualValues(t, 1, gets.n.Load(), "events during the backoff caused GETs")

	// Past the first delay (at most 1.2 s): one retry, which covers the events.
	clk.Step(time.Second)
	waitBlocked(t, clk)
	assert.EqualValues(t, 2, gets.n.Load())
	// The second delay is at least 1.6 s: the events left no extra GET.
	for range 15 {
		clk.Step(100 * time.Millisecond)
		waitBlocked(t, clk)
	}
	assert.EqualValues(t, 2, gets.n.Load(), "events were replayed after the backoff")
}

// TestAuthorityRunLogsEachErrorOnce forbids both the GET of the run loop and
// the LIST of its watch. Their errors differ; each must be logged and
// counted once even when they interleave and are retried.
func TestAuthorityRunLogsEachErrorOnce(t *testing.T) {
	client := fake.NewClientset()
	gets := interceptSecrets(client, "get", forbidden())
	lists := interceptSecrets(client, "list", forbidden())
	clk := clocktesting.NewFakeClock(testNow)
	a := newTestAuthority(t, client, clk, "authority-run-log-once")
	logs := klogtest.Capture(t)
	before := certmetricstest.LoadErrors(t, a.Name())
	both := func() bool { return certmetricstest.LoadErrors(t, a.Name())-before == 2 }

	runInBackground(t, a.Run)
	waitBlocked(t, clk)
	// Let the watch fail again after the first GET (its reflector backs off
	// on the real clock, about a second), then GET again.
	afterGet := lists.n.Load()
	waitFor(t, "the watch to fail after the first GET", func() bool { return lists.n.Load() > afterGet && both() })
	for gets.n.Load() < 2 {
		stepSeconds(t, clk, 1)
	}
	// The watch fails once more after the second GET: still two failures.
	afterGet = lists.n.Load()
	waitFor(t, "the watch to fail after the second GET", func() bool { return lists.n.Load() > afterGet })
	assert.EqualValues(t, 2, certmetricstest.LoadErrors(t, a.Name())-before, "%d GETs and %d LISTs failing with two errors are two load errors",
		gets.n.Load(), lists.n.Load())

	assert.Equal(t, 1, logs.Count("Rejected new content", "reading CA secret ns/ca: forbidden"), "GET error logged more than once")
	assert.Equal(t, 1, logs.Count("Rejected new content", "watching secret ns/ca: forbidden"), "watch error logged more than once")
	assert.ErrorContains(t, a.LastError(), "reading CA secret ns/ca: forbidden")
}

// TestAuthorityRunConflictRereads makes every write conflict. A conflict is
// re-read at once a few times, then the loop backs off like for an error;
// it is never reported as a load error.
func TestAuthorityRunConflictRereads(t *testing.T) {
	client := fake.NewClientset()
	quietWatch(client)
	gets := interceptSecrets(client, "get", nil)
	creates := interceptSecrets(client, "create", apierrors.NewAlreadyExists(corev1.Resource("secrets"), "ca"))
	clk := clocktesting.NewFakeClock(testNow)
	a := newTestAuthority(t, client, clk, "authority-run-conflict")
	logs := klogtest.Capture(t)
	before := certmetricstest.LoadErrors(t, a.Name())

	runInBackground(t, a.Run)
	waitBlocked(t, clk)
	first := creates.n.Load()
	assert.Greater(t, first, int64(1), "a conflict is re-read at once")
	// The first read comes from the watch's cache when it has listed
	// already, else from a GET; every re-read after a conflict is a GET.
	assert.GreaterOrEqual(t, gets.n.Load(), first-1, "a conflict is re-read with a GET")
	// A streak that lasts a check interval is reported
	// (TestAuthorityRunReportsAConflictStreak): stay within one.
	window := DefaultCheckInterval - time.Second
	stepSeconds(t, clk, int(window/time.Second))
	assert.LessOrEqual(t, creates.n.Load(), first*int64(attemptsWithin(window, time.Second, 1)), "conflicts retried faster than the backoff")

	creates.fail(nil)
	for a.Leaf() == nil {
		stepSeconds(t, clk, 1)
	}
	assert.Zero(t, certmetricstest.LoadErrors(t, a.Name())-before, "a conflict is not a load error")
	assert.Zero(t, logs.Count("Rejected new content"), "a conflict is not logged as an error")
	assert.NoError(t, a.LastError())
}

// TestSelfSignedRunBacksOffOnErrors makes every new leaf fail (an unknown
// key type) once one is due: SelfSigned.Run must retry with backoff, not once
// per clock step, count the failure once, and keep serving the old leaf.
func TestSelfSignedRunBacksOffOnErrors(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	rec := certreporttest.NewRecorder()
	s, err := NewSelfSigned(SelfSignedConfig{Name: "selfsigned-run-backoff", Lifetime: time.Hour, Clock: clk, EventRecorder: rec, EventObject: certreporttest.Pod})
	require.NoError(t, err)
	serving := s.Leaf()
	s.issuer.cfg.keyTypes = []dynamiccert.KeyType{"broken"} // before Run: no race
	attempts := &countingStore{caStore: s.store}
	s.store = attempts
	clk.SetTime(s.RenewAt())
	before := certmetricstest.LoadErrors(t, s.Name())

	runInBackground(t, s.Run)
	waitBlocked(t, clk)
	const window = 10 * time.Minute
	stepSeconds(t, clk, int(window/time.Second))

	n := int(attempts.n.Load())
	assert.EqualValues(t, 1, certmetricstest.LoadErrors(t, s.Name())-before, "%d attempts of one failure are one load error", n)
	got := certreporttest.Drain(rec)
	require.Len(t, got, 1, "one Event for one failure: %q", got)
	assert.True(t, strings.HasPrefix(got[0], "Warning "+dynamiccert.ReasonCertificateLoadFailed+" Load provider selfsigned-run-backoff: "), got[0])
	assert.LessOrEqual(t, n, attemptsWithin(window, time.Second, 1), "attempts in %v of 1s steps: more than the backoff allows", window)
	assert.GreaterOrEqual(t, n, attemptsWithin(window, time.Second, 1+backoff.Jitter))
	assert.ErrorContains(t, s.LastError(), `unknown key type "broken"`)
	assert.Equal(t, serving, s.Leaf(), "the current leaf is still served")
}

// countingStore counts the checks of an issuer: each one updates the store.
type countingStore struct {
	caStore
	n atomic.Int64
}

func (c *countingStore) update(ctx context.Context, now time.Time, step func(stepInput) (stepResult, error)) (stepResult, error) {
	c.n.Add(1)
	return c.caStore.update(ctx, now, step)
}

// TestAuthorityRunReportsAConflictStreak: every write of the Secret
// conflicts (another writer keeps rewriting it, or a server that refuses
// every write). One conflict is another replica that wrote first and is
// retried quietly; a streak longer than a check interval leaves the
// replica unable to write anything it decides, and must be said: before,
// LastError stayed nil however long it lasted (the simulator, seed 1908
// of stop 34: V1 after 6 minutes).
func TestAuthorityRunReportsAConflictStreak(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a := newTestAuthority(t, client, clk, "authority-run-conflicts")
	require.NoError(t, a.RunOnce(context.Background()))
	// From now on every update conflicts; a rotate request makes the
	// Authority write (it records the request handled).
	interceptSecrets(client, "update", apierrors.NewConflict(corev1.Resource("secrets"), "ca", errors.New("the object has been modified")))
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	s.Annotations = map[string]string{RotateRequestedAnnotation: clk.Now().UTC().Format(time.RFC3339)}
	require.NoError(t, client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("secrets"), s, "ns"))

	runInBackground(t, a.Run)
	waitBlocked(t, clk)
	assert.Nil(t, a.Status().LastError, "a conflict that has not lasted a check interval is reported")
	for range 40 {
		clk.Step(5 * time.Second)
		waitBlocked(t, clk)
		if a.Status().LastError != nil {
			break
		}
	}
	require.NotNil(t, a.Status().LastError, "a conflict streak of 200 s (check interval %v) left LastError nil", DefaultCheckInterval)
	assert.Contains(t, a.Status().LastError.Error(), "conflicted")
	assert.True(t, apierrors.IsConflict(a.Status().LastError), "the error still wraps the Conflict, so the run loop backs off as for one")
}
