package app_test

import (
	"context"
	"encoding/hex"
	"math/big"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/example/apiserver/app"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/loopback"
)

// waitServed polls handshakes with the loopback SNI name until the server
// presents want (the upstream serving controller picks up a new certificate
// asynchronously). Each handshake is verified against the current bundle
// at the fake clock's time.
func waitServed(t *testing.T, s *app.Server, want *big.Int, now func() time.Time) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for polls := 1; ; polls++ {
		leaf, err := handshake(s.Addr, loopback.ServerName, tlstest.Pool(t, s.Loopback.CurrentCABundleContent()), now)
		require.NoError(t, err)
		if leaf.SerialNumber.Cmp(want) == 0 {
			return polls
		}
		if time.Now().After(deadline) {
			t.Fatalf("server still serves %s, want %s, after 10s", leaf.SerialNumber.Text(16), want.Text(16))
		}
		time.Sleep(time.Duration(min(polls, 20)) * time.Millisecond)
	}
}

func selfchecks(t *testing.T) (success, failed float64) {
	t.Helper()
	v, err := testutil.GetCounterValuesFromGatherer(legacyregistry.DefaultGatherer, "evercert_loopback_selfcheck_total", map[string]string{}, "result")
	if err != nil && strings.Contains(err.Error(), "not found") {
		return 0, 0 // no self-check counted yet
	}
	require.NoError(t, err)
	return v["success"], v["error"]
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestLoopbackRotationsFakeClock rotates the loopback certificate 1,000
// times on a fake clock inside a running genericapiserver, with one
// clientset built at start-up making a request after every rotation.
func TestLoopbackRotationsFakeClock(t *testing.T) {
	const rotations = 1000
	// Every rotation drops the idle loopback connections, so this test
	// makes a connection every few milliseconds. golang.org/x/net/http2 keeps
	// a closed client connection reachable from its read-idle health-check
	// timer for up to 30s, which would show as heap growth here although it
	// is released later; turn the health check off so the heap measurement
	// shows only what rotations retain.
	t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "0")
	fc := clocktesting.NewFakeClock(time.Now())
	o := app.NewOptions()
	o.LoopbackClock = fc
	o.SelfcheckInterval = 50 * time.Millisecond // concurrent traffic on the same loopback config
	s := startServer(t, o, nil)
	ctx := context.Background()

	cfg := rest.CopyConfig(s.GenericAPIServer.LoopbackClientConfig)
	served := tlstest.RecordServedSerials(cfg)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	request := func() error {
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/healthz").DoRaw(ctx)
		return err
	}
	require.NoError(t, request())
	okBefore, failedBefore := selfchecks(t)

	var goroutinesStart int
	var heapStart uint64
	cas := map[string]bool{hex.EncodeToString(s.Loopback.Leaf().AuthorityKeyId): true}
	failures, polls, overNew, overEarlier := 0, 0, 0, 0
	issued := map[string]bool{s.Loopback.Leaf().SerialNumber.Text(16): true}
	started := time.Now()
	for i := 0; i < rotations; i++ {
		if i == 10 { // after warm-up
			goroutinesStart, heapStart = runtime.NumGoroutine(), heapInUse()
		}
		old := s.Loopback.Leaf().SerialNumber
		fc.SetTime(s.Loopback.RenewAt().Add(time.Millisecond))
		require.NoError(t, s.Loopback.RunOnce(ctx))
		leaf := s.Loopback.Leaf()
		require.NotEqual(t, 0, leaf.SerialNumber.Cmp(old), "rotation %d changed the serial", i)
		cas[hex.EncodeToString(leaf.AuthorityKeyId)] = true
		issued[leaf.SerialNumber.Text(16)] = true

		polls += waitServed(t, s, leaf.SerialNumber, fc.Now)
		if err := request(); err != nil {
			failures++
			t.Errorf("rotation %d: request failed: %v", i, err)
			continue
		}
		// The request verified and used the new leaf or, over a connection
		// that was busy when idle connections were dropped or was dialed by
		// concurrent self-check traffic before the server picked the new
		// leaf up, an earlier one: TLS verifies at handshake only.
		switch got := served.Load(); {
		case got.Cmp(leaf.SerialNumber) == 0:
			overNew++
		case issued[got.Text(16)]:
			overEarlier++
		default:
			t.Errorf("rotation %d: request went over leaf %s, which this provider never issued", i, got.Text(16))
		}
	}
	elapsed := time.Since(started)

	// Let connections closed at the last rotation wind down.
	var goroutinesEnd int
	for deadline := time.Now().Add(10 * time.Second); ; {
		goroutinesEnd = runtime.NumGoroutine()
		if goroutinesEnd <= goroutinesStart+20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	heapEnd := heapInUse()
	if p := os.Getenv("LOOPBACK_HEAP_PROFILE"); p != "" { // debugging aid
		f, err := os.Create(p)
		require.NoError(t, err)
		require.NoError(t, pprof.WriteHeapProfile(f))
		f.Close()
	}
	okAfter, failedAfter := selfchecks(t)

	t.Logf("%d rotations in %v (%.1f ms each, %.1f handshake polls each), %d CAs seen, %d failed requests, %d over the new leaf, %d over an earlier one",
		rotations, elapsed.Round(time.Millisecond), float64(elapsed.Milliseconds())/rotations, float64(polls)/rotations, len(cas), failures, overNew, overEarlier)
	t.Logf("goroutines %d -> %d; heap in use %.1f MiB -> %.1f MiB; self-checks during the run: %v ok, %v failed",
		goroutinesStart, goroutinesEnd, float64(heapStart)/(1<<20), float64(heapEnd)/(1<<20), okAfter-okBefore, failedAfter-failedBefore)
	assert.Zero(t, failures)
	assert.Greater(t, overNew, rotations*3/4, "idle connections are dropped at rotation, so requests mostly verify the new leaf")
	assert.GreaterOrEqual(t, len(cas), rotations/5, "CA rotations included")
	assert.LessOrEqual(t, goroutinesEnd, goroutinesStart+20, "goroutines must not grow with rotations")
	assert.Less(t, heapEnd, heapStart+64<<20, "heap must not grow with rotations")
	assert.Zero(t, failedAfter-failedBefore, "no failed self-check")
	assert.Positive(t, okAfter-okBefore)
}

// TestLoopbackRealClock runs the server for 30s on the real clock with a 3s
// loopback validity (leaf renewed every 2s, CA every ~7s) and a self-check
// every 100ms: not one self-check may fail.
func TestLoopbackRealClock(t *testing.T) {
	const run = 30 * time.Second
	o := app.NewOptions()
	o.LoopbackValidity = 3 * time.Second
	o.SelfcheckInterval = 100 * time.Millisecond
	okBefore, failedBefore := selfchecks(t)
	s := startServer(t, o, nil)

	leaves, cas := map[string]bool{}, map[string]bool{}
	cfg := s.GenericAPIServer.LoopbackClientConfig
	anon, err := kubernetes.NewForConfig(rest.AnonymousClientConfig(cfg))
	require.NoError(t, err)
	_, err = anon.Discovery().ServerVersion()
	require.NoError(t, err, "anonymous derivation verifies TLS at start-up")

	for end := time.Now().Add(run); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		leaf := s.Loopback.Leaf()
		leaves[leaf.SerialNumber.Text(16)] = true
		cas[hex.EncodeToString(leaf.AuthorityKeyId)] = true
	}
	okAfter, failedAfter := selfchecks(t)
	ok, failed := okAfter-okBefore, failedAfter-failedBefore
	t.Logf("%v: %d leaves, %d CAs; self-checks: %v ok, %v failed", run, len(leaves), len(cas), ok, failed)
	assert.Zero(t, failed, "no self-check may fail")
	assert.GreaterOrEqual(t, ok, float64(run/(100*time.Millisecond))/2, "self-checks ran")
	assert.GreaterOrEqual(t, len(leaves), 10, "several leaf rotations")
	assert.GreaterOrEqual(t, len(cas), 3, "CA rotations too")
	assert.NoError(t, s.Loopback.HealthCheck().Check(nil))
}

// TestHealthCheckStalled stops the rotation loop (its timers never fire) and
// steps the clock past RenewAt+Grace: /healthz and /livez fail, /readyz does
// not; RunOnce brings them back.
func TestHealthCheckStalled(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now())
	o := app.NewOptions()
	o.LoopbackClock = frozenTimers{PassiveClock: fc, frozen: clocktesting.NewFakeClock(time.Now())}
	o.SelfcheckInterval = 0
	s := startServer(t, o, nil)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(s.GenericAPIServer.LoopbackClientConfig)
	require.NoError(t, err)
	rc := cs.Discovery().RESTClient()
	status := func(path string) int {
		var code int
		rc.Get().AbsPath(path).Do(ctx).StatusCode(&code)
		return code
	}
	require.Equal(t, 200, status("/healthz"))

	fc.SetTime(s.Loopback.RenewAt().Add(s.Loopback.Config().Grace + time.Second))
	assert.Error(t, s.Loopback.HealthCheck().Check(nil))
	assert.Equal(t, 500, status("/healthz"), "stalled rotation fails healthz")
	assert.Equal(t, 500, status("/livez"), "and livez")
	assert.Equal(t, 200, status("/readyz"), "but not readyz")

	require.NoError(t, s.Loopback.RunOnce(ctx))
	waitServed(t, s, s.Loopback.Leaf().SerialNumber, fc.Now)
	assert.Equal(t, 200, status("/healthz"))
	assert.Equal(t, 200, status("/livez"))
}
