package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/evercert/evercert/dynamiccert"
)

// waitWaiters waits until n loops sleep on the fake clock.
func waitWaiters(t *testing.T, clk *clocktesting.FakeClock, n int) {
	t.Helper()
	waitFor(t, "the loops to wait on the clock", func() bool { return clk.Waiters() >= n })
}

// fakeReplica is another replica's Lease, renewed by hand: alive, but it
// never confirms a successor.
type fakeReplica struct {
	t      *testing.T
	client *fake.Clientset
	clk    *clocktesting.FakeClock
	name   string
	n      int
}

func newFakeReplica(t *testing.T, client *fake.Clientset, clk *clocktesting.FakeClock, id string, seconds int32) *fakeReplica {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "ca-" + id, Namespace: "ns", Labels: map[string]string{LeaseLabel: "ca"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(id), LeaseDurationSeconds: ptr.To(seconds)},
	}
	_, err := client.CoordinationV1().Leases("ns").Create(context.Background(), l, metav1.CreateOptions{})
	require.NoError(t, err)
	return &fakeReplica{t: t, client: client, clk: clk, name: l.Name}
}

// renew renews the Lease and waits until a sees the renewal.
func (f *fakeReplica) renew(a *Authority) {
	f.t.Helper()
	leases := f.client.CoordinationV1().Leases("ns")
	l, err := leases.Get(context.Background(), f.name, metav1.GetOptions{})
	require.NoError(f.t, err)
	f.n++
	l.Spec.RenewTime = &metav1.MicroTime{Time: f.clk.Now().Add(time.Duration(f.n) * time.Microsecond)}
	signAsReplica(f.t, f.client, l, f.clk.Now())
	l, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
	require.NoError(f.t, err)
	want := l.ResourceVersion + "/" + l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	waitFor(f.t, "the renewal to be seen", func() bool {
		a.replicas.mu.Lock()
		defer a.replicas.mu.Unlock()
		s := a.replicas.seen[f.name]
		return s != nil && s.rv == want
	})
}

// TestAttackPausedProcessWaitsForLiveReplicas: a successor waits for a live
// replica that has not confirmed it, past its minimum delay. Then this
// process is paused (a frozen cgroup, SIGSTOP, a starved VM). When it
// wakes, its check runs before its watch delivers the renewals the other
// replica made meanwhile: judged on the last renewal it saw, every other
// replica looks dead, and the successor signed without the replica that
// does not have it. Time this process did not watch must not count towards
// a Lease's expiry.
func TestAttackPausedProcessWaitsForLiveReplicas(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Name: "attack-pause", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "a",
		Hosts: []string{"localhost"}, Lifetime: 10 * time.Minute, LeaseDuration: 20 * time.Second, Clock: clk,
	})
	require.NoError(t, err)
	stuck := newFakeReplica(t, client, clk, "stuck", 20)
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	step := func(d time.Duration) {
		stuck.renew(a)
		clk.Step(d)
		waitWaiters(t, clk, 2) // the issuer and the Lease loop
	}
	for a.Status().Successor == nil {
		step(time.Minute)
	}
	succ := a.Status().Successor
	// Past the minimum delay, only the stuck replica holds it back (this
	// one announces it once its own delay is over).
	for {
		step(5 * time.Second)
		st := a.Status()
		require.NotNil(t, st.Successor)
		if assert.ObjectsAreEqual([]string{"replica/stuck"}, st.Successor.Pending) {
			break
		}
		require.True(t, clk.Now().Before(succ.SignsNoEarlierThan.Add(5*time.Minute)), "still pending after the minimum delay: %v", st.Successor.Pending)
	}

	// The pause: a minute, three lease durations, with no renewal seen.
	stuck.renew(a)
	clk.Step(time.Minute)
	waitWaiters(t, clk, 2)
	st := a.Status()
	require.NotNil(t, st.Successor, "the successor signed at wake-up although a live replica does not have it")
	assert.Equal(t, []string{"replica/stuck"}, st.Successor.Pending)

	// The renewals arrive; the replica is still waited for while it renews.
	for range 20 {
		step(5 * time.Second)
		require.NotNil(t, a.Status().Successor, "promoted while a live replica does not have the successor")
	}
	// It stops renewing: once its Lease expires it is not waited for.
	waitFor(t, "promotion after the stuck replica's lease expired", func() bool {
		clk.Step(5 * time.Second)
		waitWaiters(t, clk, 2)
		return a.Status().Successor == nil
	})
	assert.Equal(t, succ.Serial, a.Status().Signing.Serial)
	assert.Zero(t, a.Status().UnsafeRotations)
}

// TestAttackEveryReplicaPausedBeyondTheCA: every replica is down (or
// paused) for longer than a CA lifetime; they wake together. Exactly one
// fresh CA must win (an unsafe rotation, counted once), both replicas must
// serve leaves that chain to ca.crt, and they must not fight over it.
func TestAttackEveryReplicaPausedBeyondTheCA(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	mk := func(id string) *Authority {
		a := attackAuthority(t, client, clk, "attack-allpaused-"+id, nil)
		runInBackground(t, a.Run)
		waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
		return a
	}
	a, b := mk("a"), mk("b")
	settle(t, clk, 2, client, writes, 3, a, b)
	clk.Step(12 * time.Hour) // the CA lives 8h
	settle(t, clk, 2, client, writes, 6, a, b)
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Len(t, mustParseBundle(t, s.Data[dynamiccert.SecretCAKey]), 1, "expired CAs stay in ca.crt")
	for _, r := range []*Authority{a, b} {
		require.NoError(t, handshakeWith(t, r, s.Data[dynamiccert.SecretCAKey], clk.Now), "%s", r.Name())
	}
	assert.Equal(t, 1, a.Status().UnsafeRotations+b.Status().UnsafeRotations)
	for range 30 {
		clk.Step(10 * time.Minute)
		settle(t, clk, 2, client, writes, 3, a, b)
	}
	assert.Equal(t, 1, a.Status().UnsafeRotations+b.Status().UnsafeRotations)
}

// TestAttackDeletedLeaseOfLiveReplica: someone deletes the Lease of a live
// replica that has not confirmed the successor (kubectl, a cleanup job, a
// second writer). That is no evidence the replica is gone: it recreates its
// Lease at its next renewal. Until its last renewal has aged out, it must
// still be waited for; the deletion alone let the successor sign at once.
func TestAttackDeletedLeaseOfLiveReplica(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Name: "attack-deleted-lease", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "a",
		Hosts: []string{"localhost"}, Lifetime: 10 * time.Minute, LeaseDuration: 20 * time.Second, Clock: clk,
	})
	require.NoError(t, err)
	stuck := newFakeReplica(t, client, clk, "stuck", 20)
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	step := func(d time.Duration) {
		stuck.renew(a)
		clk.Step(d)
		waitWaiters(t, clk, 2)
	}
	for a.Status().Successor == nil {
		step(time.Minute)
	}
	succ := a.Status().Successor
	for clk.Now().Before(succ.SignsNoEarlierThan.Add(time.Minute)) {
		step(5 * time.Second)
	}
	require.Equal(t, []string{"replica/stuck"}, a.Status().Successor.Pending)

	stuck.renew(a)
	require.NoError(t, client.CoordinationV1().Leases("ns").Delete(context.Background(), stuck.name, metav1.DeleteOptions{}))
	waitFor(t, "the deletion to be seen", func() bool {
		a.replicas.mu.Lock()
		defer a.replicas.mu.Unlock()
		l := a.replicas.seen[stuck.name]
		return l == nil || l.deleted
	})
	kickAndWait(t, a.issuer)
	require.NotNil(t, a.Status().Successor, "the successor signed because a live replica's Lease was deleted")
	assert.Equal(t, []string{"replica/stuck"}, a.Status().Successor.Pending)

	// The replica does not come back: once its last renewal aged out, it
	// is not waited for, and the deleted entry does not linger.
	waitFor(t, "promotion", func() bool {
		clk.Step(5 * time.Second)
		waitWaiters(t, clk, 2)
		return a.Status().Successor == nil
	})
	for range 100 {
		clk.Step(5 * time.Second)
		waitWaiters(t, clk, 2)
	}
	a.replicas.mu.Lock()
	_, lingering := a.replicas.seen[stuck.name]
	a.replicas.mu.Unlock()
	assert.False(t, lingering, "a deleted Lease stays in the seen map")
}
