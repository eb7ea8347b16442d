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
	t.Parallel() // see guard
	const lease, skew = 90 * time.Second, 10 * time.Second
	require.Equal(t, 2*skew, leaseMargin(lease, skew), "the margin is twice the tolerance here (a renewal interval is longer)")
	waitForStuckPeer(t, lease, skew, false)
}

// TestADeletedLeaseIsWaitedForPastItsLeaseByTheMargin is the same with the
// stuck replica's Lease deleted after its last renewal (by hand, or by
// anyone allowed to delete Leases). A delete is no evidence the replica
// is gone (seenLease.deleted): it is waited for until its last renewal
// ages out, its duration and the margin. The Lease loop's collect forgot
// a deleted Lease once its duration alone had passed, so the successor
// promoted up to the margin early (review of stop 39).
func TestADeletedLeaseIsWaitedForPastItsLeaseByTheMargin(t *testing.T) {
	t.Parallel() // see guard
	const lease, skew = time.Minute, 15 * time.Second
	require.Equal(t, lease/3, leaseMargin(lease, skew), "the margin is a renewal interval here")
	waitForStuckPeer(t, lease, skew, true)
}

// waitForStuckPeer runs one Authority (its Run loops, on a fake clock
// stepped 5 s at a time) beside a hand-renewed replica that never
// confirms the successor, stops renewing it once it is all the successor
// waits for (and deletes its Lease if deleteLease), and checks that the
// successor waits for it until the lease duration and the margin have
// passed since its last renewal was seen, and signs, counted safe, after.
func waitForStuckPeer(t *testing.T, lease, skew time.Duration, deleteLease bool) {
	t.Helper()
	const step = 5 * time.Second
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Name: t.Name(), Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "a",
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
	if deleteLease {
		require.NoError(t, client.CoordinationV1().Leases("ns").Delete(context.Background(), stuck.name, metav1.DeleteOptions{}))
		waitFor(t, "the delete to be seen", func() bool {
			a.replicas.mu.Lock()
			defer a.replicas.mu.Unlock()
			l := a.replicas.seen[stuck.name]
			return l != nil && l.deleted
		})
	}
	margin := leaseMargin(lease, skew)
	for clk.Now().Add(step).Before(last.Add(lease + margin)) {
		tick()
		if deleteLease {
			// The Lease loop collects after each of its writes, a renewal
			// interval apart, at a phase this test does not choose: one
			// falls anywhere in the margin, or just past it. The loop's
			// own collect runs at every tick too, so that every phase is
			// tried (with the Run loops running, not instead of them).
			a.replicas.collect(context.Background())
		}
		st := a.Status()
		require.NotNil(t, st.Successor, "promoted %v after the stuck replica's last renewal was seen (Lease deleted: %v), while its Lease holds on its own clock (%v and the margin %v)",
			clk.Now().Sub(last), deleteLease, lease, margin)
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
