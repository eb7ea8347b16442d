package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestADeletedLeaseIsWaitedForPastItsLeaseByTheMargin is
// TestAPeerIsWaitedForPastItsLeaseByTheMargin with the stuck replica's Lease
// deleted after its last renewal (by hand, or by anyone allowed to delete
// Leases). A delete is no evidence the replica is gone (seenLease.deleted):
// it is waited for until its last renewal ages out, which is its lease
// duration and the margin (waitedForLocked), as for a Lease that is not
// deleted. collect forgets a deleted Lease once its duration alone has
// passed (at the Lease loop's first renewal after that), so pendingOf stops
// waiting for it up to the margin early, and the successor promotes under
// a replica whose Lease holds on its own clock.
func TestADeletedLeaseIsWaitedForPastItsLeaseByTheMargin(t *testing.T) {
	const (
		lease = time.Minute
		skew  = 15 * time.Second
		step  = 5 * time.Second
	)
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Name: "lease-margin-deleted", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "a",
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

	// The last renewal this process sees; then the Lease is deleted.
	stuck.renew(a)
	last := clk.Now()
	require.NoError(t, client.CoordinationV1().Leases("ns").Delete(context.Background(), stuck.name, metav1.DeleteOptions{}))
	waitFor(t, "the delete to be seen", func() bool {
		a.replicas.mu.Lock()
		defer a.replicas.mu.Unlock()
		l := a.replicas.seen[stuck.name]
		return l != nil && l.deleted
	})
	waitedUntil := last.Add(lease + leaseMargin(lease, skew))
	for clk.Now().Add(step).Before(waitedUntil) {
		tick()
		// The Lease loop collects after every renewal it writes, a third
		// of the duration apart: one falls anywhere in the window. Collect
		// at every tick so that the test does not depend on where.
		a.replicas.collect(context.Background())
		st := a.Status()
		require.NotNil(t, st.Successor, "promoted %v after the stuck replica's last renewal was seen (its Lease deleted since), before its duration %v and the margin %v passed",
			clk.Now().Sub(last), lease, leaseMargin(lease, skew))
		require.Equal(t, []string{"replica/stuck"}, st.Successor.Pending, "at %v after the last renewal", clk.Now().Sub(last))
	}
	for range 4 {
		tick()
	}
	require.Nil(t, a.Status().Successor, "the successor still waits %v after the stuck replica's last renewal", clk.Now().Sub(last))
	assert.Zero(t, a.Status().UnsafeRotations)
}
