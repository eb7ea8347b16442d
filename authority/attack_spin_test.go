package authority

import (
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/evercert/evercert/internal/clocktest"
)

// TestAttackNoSpinWhileObserverPending: a successor has waited out its
// minimum delay but an observer has not confirmed it (a caBundle target
// that is contested, a read-only bundle file). That can last days. The Run
// loop must sleep until something can change; it computed its next
// deadline as the end of the minimum delay, already past, and so checked
// again at once, forever: on a real clock, a busy loop of Secret GETs
// against the API server.
func TestAttackNoSpinWhileObserverPending(t *testing.T) {
	client := fake.NewClientset()
	gets := interceptSecrets(client, "get", nil)
	clk := clocktest.NewRealTimers(testNow)
	stuck := &testObserver{}
	a := attackAuthority(t, client, clk, "attack-spin", func(c *Config) { c.Observers = []Observer{stuck} })
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	waitBlocked(t, clk.FakeClock)
	succ := runToSuccessor(t, a, clk.FakeClock)
	clk.Step(succ.SignsNoEarlierThan.Sub(clk.Now()) + time.Minute)

	// The loop must go back to sleep on the clock; a spin never does and is
	// caught by its GET count instead of by a timeout.
	before := gets.n.Load()
	waitFor(t, "the loop to sleep", func() bool {
		require.Less(t, gets.n.Load()-before, int64(100), "Secret GETs with the clock stopped: the Run loop spins (%d immediate timers)", clk.Immediate.Load())
		return clk.HasWaiters() && len(a.kick) == 0
	})
	st := a.Status()
	require.NotNil(t, st.Successor)
	assert.Equal(t, []string{"test-observer"}, st.Successor.Pending)

	// It still looks again every check interval, and promotes on the
	// observer's word.
	stuck.set(true)
	waitFor(t, "promotion", func() bool { return a.Status().Successor == nil })
	assert.Zero(t, a.Status().UnsafeRotations)
}

// countingObserver never confirms and counts how often it is asked.
type countingObserver struct{ asked atomic.Int64 }

func (o *countingObserver) Name() string { return "counting" }
func (o *countingObserver) Observed(*x509.Certificate) bool {
	o.asked.Add(1)
	return false
}

// TestAttackSelfSignedNoSpinWhileObserverPending is the same for
// SelfSigned, where the busy loop burns a core instead of the API server.
func TestAttackSelfSignedNoSpinWhileObserverPending(t *testing.T) {
	clk := clocktest.NewRealTimers(testNow)
	obs := &countingObserver{}
	s, err := NewSelfSigned(SelfSignedConfig{Name: "attack-spin-ss", Lifetime: time.Hour, Clock: clk, Observers: []Observer{obs}})
	require.NoError(t, err)
	runInBackground(t, s.Run)
	waitBlocked(t, clk.FakeClock)
	for s.Status().Successor == nil {
		clk.Step(time.Minute)
		waitBlocked(t, clk.FakeClock)
	}
	succ := s.Status().Successor
	clk.Step(succ.SignsNoEarlierThan.Sub(clk.Now()) + time.Minute)
	before := obs.asked.Load()
	waitFor(t, "the loop to sleep", func() bool {
		require.Less(t, obs.asked.Load()-before, int64(1000), "the Run loop spins (%d immediate timers)", clk.Immediate.Load())
		return clk.HasWaiters() && len(s.kick) == 0
	})
	require.NotNil(t, s.Status().Successor)
}
