package authority

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/evercert/evercert/internal/clocktest"
)

// TestAttackNoZeroWaits drives the loops through pauses, an outage and
// rotations with stuck observers on a clock whose zero timers fire at once,
// as real ones do. A loop that arms a timer for zero or less is one step
// from a busy loop; none may.
func TestAttackNoZeroWaits(t *testing.T) {
	t.Run("SelfSigned pauses", func(t *testing.T) {
		clk := clocktest.NewRealTimers(testNow)
		obs := &testObserver{}
		s, err := NewSelfSigned(SelfSignedConfig{Name: "attack-zero-ss", Lifetime: time.Hour, Clock: clk, Observers: []Observer{obs}})
		require.NoError(t, err)
		runInBackground(t, s.Run)
		waitBlocked(t, clk.FakeClock)
		for _, d := range []time.Duration{time.Minute, 81 * time.Minute, 5 * time.Hour, 13 * time.Hour, time.Second} {
			for range 50 {
				clk.Step(d)
				waitBlocked(t, clk.FakeClock)
				if clk.Now().Minute()%7 == 0 {
					obs.set(!obs.ok.Load())
					waitBlocked(t, clk.FakeClock)
				}
			}
		}
		assert.Zero(t, clk.Immediate.Load())
		require.NoError(t, handshakeWith(t, s, s.CurrentCABundleContent(), clk.Now))
	})
	t.Run("Authority with Leases, outage and pauses", func(t *testing.T) {
		client := fake.NewClientset()
		optimistic(client)
		gets := interceptSecrets(client, "get", nil)
		clk := clocktest.NewRealTimers(testNow)
		mk := func(id string) *Authority {
			a := attackAuthority(t, client, clk, "attack-zero-"+id, func(c *Config) {
				c.DisableReplicaAnnouncements = false
				c.LeaseDuration = 30 * time.Second
			})
			runInBackground(t, a.Run)
			waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
			return a
		}
		a, b := mk("a"), mk("b")
		waitWaiters(t, clk.FakeClock, 4)
		for i, d := range []time.Duration{time.Minute, 7 * time.Minute, 3 * time.Hour, 10 * time.Second} {
			if i == 2 {
				gets.fail(apierrors.NewServiceUnavailable("etcd is down"))
			}
			for range 40 {
				clk.Step(d)
				waitWaiters(t, clk.FakeClock, 4)
			}
			gets.fail(nil)
		}
		assert.Zero(t, clk.Immediate.Load())
		for _, r := range []*Authority{a, b} {
			require.NoError(t, handshakeWith(t, r, r.CurrentCABundleContent(), clk.Now))
		}
	})
}
