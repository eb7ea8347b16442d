package loopback_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/clocktest"
	"github.com/evercert/evercert/loopback"
)

type serialSet struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (s *serialSet) add(v string) {
	s.mu.Lock()
	s.seen[v] = true
	s.mu.Unlock()
}

func (s *serialSet) n() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

type listenerFunc func()

func (f listenerFunc) Enqueue() { f() }

// TestOneSecondValidityDoesNotSpin: with Validity 1s, MinValidity, a leaf
// issued at x.9 s had its NotAfter truncated by X.509 to 0.1 s later, inside
// its renew-before, so Run re-issued it at once, forever (8,133 re-issues
// and 2.5 MB of log in 8 s with the example server's --loopback-validity=1s).
// Through Run on a fake clock the leaf is now issued at most once per
// authority.MinReissueInterval, the health check never reports a stall,
// and the loopback client verifies the server at every step.
func TestOneSecondValidityDoesNotSpin(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 900_000_000, time.UTC)
	clk := clocktest.NewRealTimers(start)
	c, err := loopback.NewCertificate(loopback.CertificateConfig{Validity: loopback.MinValidity, Clock: clk})
	require.NoError(t, err)
	leaves := &serialSet{seen: map[string]bool{}}
	leaves.add(c.Leaf().SerialNumber.String())
	c.AddListener(listenerFunc(func() { leaves.add(c.Leaf().SerialNumber.String()) }))

	const token = "token"
	srv := tlsServer(t, c, token)
	cfg, err := c.RestConfig(srv.Listener.Addr().String(), token)
	require.NoError(t, err)
	hc, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, 1) }()
	defer func() { cancel(); <-done }()

	bound := func() int { return int(clk.Now().Sub(start)/authority.MinReissueInterval) + 1 }
	settle := func() {
		deadline := time.Now().Add(30 * time.Second)
		for !clk.HasWaiters() {
			require.LessOrEqual(t, leaves.n(), bound(), "leaves issued by %v: faster than one per MinReissueInterval (%d immediate timers)", clk.Now().Sub(start), clk.Immediate.Load())
			require.False(t, time.Now().After(deadline), "the Run loop never slept on the clock")
			time.Sleep(50 * time.Microsecond)
		}
	}
	settle()
	check := c.HealthCheck()
	const steps, step = 200, 50 * time.Millisecond // 10 s
	for i := range steps {
		clk.Step(step)
		settle()
		require.LessOrEqual(t, leaves.n(), bound())
		require.NoError(t, check.Check(nil), "at %v", clk.Now().Sub(start))
		if i%20 == 0 {
			code, _, err := get(t, hc, cfg.Host)
			require.NoError(t, err, "at %v", clk.Now().Sub(start))
			require.Equal(t, http.StatusOK, code)
		}
	}
	assert.GreaterOrEqual(t, leaves.n(), 6, "a 1s leaf is still renewed before it expires")
	t.Logf("%d leaves in %v", leaves.n(), time.Duration(steps)*step)
}
