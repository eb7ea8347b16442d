package authority

import (
	"context"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/evercert/evercert/internal/clocktest"
)

// leafCounter counts the distinct leaves a provider served, from its
// listener notifications.
type leafCounter struct {
	leaf func() *x509.Certificate
	mu   sync.Mutex
	seen map[string]bool
}

func (c *leafCounter) Enqueue() {
	if l := c.leaf(); l != nil {
		c.mu.Lock()
		c.seen[serial(l)] = true
		c.mu.Unlock()
	}
}

func (c *leafCounter) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func countLeaves(p interface {
	AddListener(dynamiccertificates.Listener)
	Leaf() *x509.Certificate
}) *leafCounter {
	c := &leafCounter{leaf: p.Leaf, seen: map[string]bool{}}
	c.seen[serial(p.Leaf())] = true
	p.AddListener(c)
	return c
}

// reissueSteps steps clk steps times by step, calls poke (if not nil), lets
// the Run loop go back to sleep after each, and checks on the way that the leaves counted by c
// stay within the floor and that the served leaf never expires. A Run loop
// that re-issues without the clock moving is caught by its count, not by a
// timeout.
func reissueSteps(t *testing.T, clk *clocktest.RealTimers, c *leafCounter, kick chan struct{}, steps int, step time.Duration, poke func()) {
	t.Helper()
	start := clk.Now()
	bound := func() int { return int(clk.Now().Sub(start)/MinReissueInterval) + 1 }
	settle := func() {
		waitFor(t, "the Run loop to sleep on the clock", func() bool {
			require.LessOrEqual(t, c.n(), bound(), "leaves issued by %s: faster than one per MinReissueInterval (%d immediate timers)", clk.Now().Sub(start), clk.Immediate.Load())
			return clk.HasWaiters() && len(kick) == 0
		})
	}
	settle()
	for range steps {
		clk.Step(step)
		if poke != nil {
			poke()
		}
		settle()
		leaf := c.leaf()
		require.False(t, clk.Now().After(leaf.NotAfter), "served leaf expired at %s (NotAfter %s)", clk.Now(), leaf.NotAfter)
	}
	require.LessOrEqual(t, c.n(), bound())
}

// offSecond is a start time 0.9 s past a whole second: a 1s leaf issued
// then has its NotAfter truncated by X.509 to 0.1 s later.
var offSecond = testNow.Add(900 * time.Millisecond)

// TestSelfSignedOneSecondLifetimeDoesNotSpin: a 1s leaf issued at x.9 s was
// truncated to a NotAfter 0.1 s away, already inside its renew-before of
// 1/3 s, so Run re-issued it at once, forever (4,414 rotations in 6 s with
// --self-signed-validity=1s). Through the real Run loop on a fake clock, the
// provider now issues at most one leaf per MinReissueInterval, still renews
// the leaf before it expires, and CA rotations go on.
func TestSelfSignedOneSecondLifetimeDoesNotSpin(t *testing.T) {
	clk := clocktest.NewRealTimers(offSecond)
	s, err := NewSelfSigned(SelfSignedConfig{Name: "floor-ss", Lifetime: time.Second, Clock: clk})
	require.NoError(t, err)
	c := countLeaves(s)
	firstCA := s.Status().Signing.Serial
	runInBackground(t, s.Run)

	const steps, step = 200, 50 * time.Millisecond // 10 s
	reissueSteps(t, clk, c, s.kick, steps, step, nil)
	assert.GreaterOrEqual(t, c.n(), 6, "a 1s leaf is still renewed before it expires")
	assert.NotEqual(t, firstCA, s.Status().Signing.Serial, "the 3s CA rotated")
	assert.Zero(t, s.Status().UnsafeRotations)
	t.Logf("%d leaves in %v", c.n(), time.Duration(steps)*step)
}

// TestAuthorityOneSecondLifetimeDoesNotSpin is the same for the Authority's
// leaf, whose CA lives in a Secret.
func TestAuthorityOneSecondLifetimeDoesNotSpin(t *testing.T) {
	clk := clocktest.NewRealTimers(offSecond)
	a := attackAuthority(t, fake.NewClientset(), clk, "floor-authority", func(c *Config) { c.Lifetime = time.Second })
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	c := countLeaves(a)

	const steps, step = 200, 50 * time.Millisecond
	reissueSteps(t, clk, c, a.kick, steps, step, nil)
	assert.GreaterOrEqual(t, c.n(), 6, "a 1s leaf is still renewed before it expires")
	t.Logf("%d leaves in %v", c.n(), time.Duration(steps)*step)
}

// TestReissueFloorHoldsWhateverTheSchedule: even a leaf the schedule finds
// due at every check (here its CA changes at every check, as if a Secret
// were fought over, and something notifies the provider at every step of
// 10ms) is re-issued at most once per MinReissueInterval on the provider's
// clock; the Run loop sleeps until the floor ends instead of spinning.
func TestReissueFloorHoldsWhateverTheSchedule(t *testing.T) {
	clk := clocktest.NewRealTimers(testNow)
	s, err := NewSelfSigned(SelfSignedConfig{Name: "floor-always-due", Lifetime: time.Hour, Clock: clk})
	require.NoError(t, err)
	c := countLeaves(s)
	s.store = &churningStore{memoryStore: s.store.(*memoryStore), rotation: s.sched, now: clk.Now}
	runInBackground(t, s.Run)

	const steps, step = 100, 10 * time.Millisecond // 1 s
	reissueSteps(t, clk, c, s.kick, steps, step, s.Enqueue)
	assert.GreaterOrEqual(t, c.n(), 2, "a due leaf is still re-issued once the floor ends")
	t.Logf("%d leaves in %v", c.n(), time.Duration(steps)*step)
}

// churningStore replaces the signing CA at every update, so the leaf is
// always signed by a CA that no longer signs.
type churningStore struct {
	*memoryStore
	rotation
	now func() time.Time
}

func (c *churningStore) update(ctx context.Context, now time.Time, step func(stepInput) (stepResult, error)) (stepResult, error) {
	return c.memoryStore.update(ctx, now, func(in stepInput) (stepResult, error) {
		res, err := step(in)
		if err != nil {
			return res, err
		}
		ca, err := c.newCA(c.now())
		if err != nil {
			return res, err
		}
		res.state.signing, res.state.bundle = ca, append(res.state.bundle, ca.Cert)
		res.write = true
		return res, nil
	})
}

// TestIssuedLifetimeNeverDueAtIssue: the leaf's NotAfter as X.509 keeps it
// (truncated to whole seconds) is never within renew-before of the issue
// time, and never before now+lifetime when it had to be rounded; ordinary
// schedules keep X.509's truncation.
func TestIssuedLifetimeNeverDueAtIssue(t *testing.T) {
	for _, now := range []time.Time{testNow, offSecond, testNow.Add(time.Nanosecond), testNow.Add(500 * time.Millisecond)} {
		for _, tc := range []struct{ life, renewBefore time.Duration }{
			{time.Second, time.Second / 3}, {time.Second, 999 * time.Millisecond}, {time.Second, time.Nanosecond},
			{1500 * time.Millisecond, time.Second}, {3 * time.Second, time.Second}, {time.Hour, 20 * time.Minute},
		} {
			r := rotation{leafRenewBefore: tc.renewBefore}
			asked := now.Add(r.issuedLifetime(now, tc.life))
			kept := asked.Truncate(time.Second) // what crypto/x509 encodes
			assert.True(t, kept.Add(-tc.renewBefore).After(now), "%v %+v: due at issue", now, tc)
			assert.False(t, kept.Before(now.Add(min(tc.life, tc.renewBefore+MinReissueInterval))), "%v %+v: ends at %v", now, tc, kept)
			if tc.life-tc.renewBefore >= time.Second+MinReissueInterval {
				assert.Equal(t, now.Add(tc.life), asked, "%v %+v: an ordinary schedule is issued as asked", now, tc)
			}
		}
	}
}

// TestSelfSignedRefusesSubSecondLifetime: X.509 cannot express a shorter
// validity, and the floor would let such a leaf expire before its
// successor.
func TestSelfSignedRefusesSubSecondLifetime(t *testing.T) {
	_, err := NewSelfSigned(SelfSignedConfig{Lifetime: 999 * time.Millisecond})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lifetime 999ms must be at least 1s")
	_, err = NewSelfSigned(SelfSignedConfig{Lifetime: time.Hour, RenewBefore: 100 * time.Millisecond, CARenewBefore: time.Second, PropagationDelay: 600 * time.Millisecond})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "must be at least 500ms")
}
