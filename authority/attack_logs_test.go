package authority

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/klogtest"
)

// TestAttackLogsPerStepAreBounded: two replicas with Leases run through
// three CA lifetimes in five-minute steps. What they log must grow with the
// rotations, not with the steps: no line that repeats at every check.
func TestAttackLogsPerStepAreBounded(t *testing.T) {
	logs := klogtest.Capture(t)
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	mk := func(id string) *Authority {
		a := attackAuthority(t, client, clk, "attack-logs-"+id, func(c *Config) {
			c.DisableReplicaAnnouncements = false
			c.LeaseDuration = 3 * time.Minute
		})
		runInBackground(t, a.Run)
		waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
		return a
	}
	a, b := mk("a"), mk("b")
	waitWaiters(t, clk, 4)
	const steps = 3 * 8 * 12 // three CA lifetimes of 8h, in 5-minute steps
	cas := map[string]bool{}
	for range steps {
		clk.Step(5 * time.Minute)
		waitWaiters(t, clk, 4)
		cas[a.Status().Signing.Serial] = true
	}
	require.GreaterOrEqual(t, len(cas), 3)
	lines := logs.Count("")
	t.Logf("%d log lines for %d CAs in %d steps", lines, len(cas), steps)
	// Per replica and CA: created or published, promoted, leaves issued
	// (a leaf lives an hour: 8 per CA lifetime, 12 with capped ones).
	assert.LessOrEqual(t, lines, 2*len(cas)*16, "log lines in %d steps", steps)
	assert.Zero(t, logs.Count("level=ERROR"))
	assert.Zero(t, a.Status().UnsafeRotations+b.Status().UnsafeRotations)
}
