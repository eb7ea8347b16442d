package authority

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestAPeerIsWaitedForPastItsLeaseByTheMargin: a successor waits past its
// minimum delay for one live replica that has not confirmed it. That
// replica's renewals stop: it cannot reach the API server. Its clock was
// 10 s ahead of this one when it renewed and is 10 s behind now (NTP
// steps, each within the 10 s skew tolerance of this clock), so on its own
// clock its Lease holds 20 s past what this process measures. It serves
// on meanwhile, and its consumers lack the successor. This process must
// wait for it for the Lease duration and the margin (leaseMargin: twice
// the tolerance, at most a renewal interval) after the last renewal it
// saw, and promote after that: it used to promote as soon as the duration
// had passed on its own clock (simulator seeds 5033 and 200906, and a
// review's 200900).
func TestAPeerIsWaitedForPastItsLeaseByTheMargin(t *testing.T) {
	const (
		lease = 90 * time.Second
		skew  = 10 * time.Second
		step  = 5 * time.Second
	)
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Name: "lease-margin", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "a",
		Hosts: []string{"localhost"}, Lifetime: 10 * time.Minute, LeaseDuration: lease, SkewTolerance: skew,
		CheckInterval: step, Clock: clk,
	})
	require.NoError(t, err)
	stuck := newFakeReplica(t, client, clk, "stuck", int32(lease/time.Second))
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	tick := func() {
		clk.Step(step)
		waitWaiters(t, clk, 2) // the issuer and the Lease loop
	}
	for a.Status().Successor == nil {
		stuck.renew(a)
		tick()
	}
	succ := a.Status().Successor
	// Past the minimum delay, only the stuck replica holds it back.
	for {
		stuck.renew(a)
		tick()
		st := a.Status()
		require.NotNil(t, st.Successor)
		if assert.ObjectsAreEqual([]string{"replica/stuck"}, st.Successor.Pending) {
			break
		}
		require.True(t, clk.Now().Before(succ.SignsNoEarlierThan.Add(10*time.Minute)), "still pending after the minimum delay: %v", st.Successor.Pending)
	}

	// The last renewal this process sees.
	stuck.renew(a)
	last := clk.Now()
	waitedUntil := last.Add(lease + leaseMargin(lease, skew))
	require.Equal(t, last.Add(lease+2*skew), waitedUntil, "the margin is twice the tolerance here (a renewal interval is longer)")
	for clk.Now().Add(step).Before(waitedUntil) {
		tick()
		st := a.Status()
		require.NotNil(t, st.Successor, "promoted %v after the stuck replica's last renewal was seen, while its Lease holds on its own clock (%v and the margin %v)",
			clk.Now().Sub(last), lease, 2*skew)
		require.Equal(t, []string{"replica/stuck"}, st.Successor.Pending, "at %v after the last renewal", clk.Now().Sub(last))
	}
	// Past the margin it is not waited for: the successor signs.
	for range 4 {
		tick()
	}
	require.Nil(t, a.Status().Successor, "the successor still waits %v after the stuck replica's last renewal", clk.Now().Sub(last))
	assert.Equal(t, succ.Serial, a.Status().Signing.Serial)
	assert.Zero(t, a.Status().UnsafeRotations)
}
