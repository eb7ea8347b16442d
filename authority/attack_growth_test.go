package authority

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/klogtest"
)

func forbidLeaseDeletes(client *fake.Clientset) {
	client.PrependReactor("delete", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", errors.New("RBAC: delete not allowed"))
	})
}

func countLeases(t *testing.T, client *fake.Clientset) int {
	t.Helper()
	l, err := client.CoordinationV1().Leases("ns").List(context.Background(), metav1.ListOptions{LabelSelector: LeaseLabel + "=ca"})
	require.NoError(t, err)
	return len(l.Items)
}

// TestAttackRestartsDoNotAccumulateLeases: every process start announces
// itself under a new replica ID (the pod name plus a random suffix), so a
// Deployment leaves one Lease behind per pod it ever ran. Nobody removed
// them: the Leases in the namespace, and every replica's list, watch and
// seen map, grew with every rollout, forever. Leases whose replica is long
// gone must be cleaned up by the replicas that remain.
func TestAttackRestartsDoNotAccumulateLeases(t *testing.T) {
	client := fake.NewClientset()
	// The pods of these rollouts crash (or are killed past their grace
	// period): a graceful stop deletes its own Lease, so Leases pile up
	// only where a process could not. Refusing the deletes while they roll
	// leaves each Lease behind, as a crash does.
	var crashing atomic.Bool
	crashing.Store(true)
	client.PrependReactor("delete", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		if crashing.Load() {
			return true, nil, errors.New("the process died before it could delete its Lease")
		}
		return false, nil, nil
	})
	clk := clocktesting.NewFakeClock(testNow)
	start := func() (*Authority, context.CancelFunc) {
		a, err := New(Config{
			Name: "attack-leases", Namespace: "ns", SecretName: "ca", Client: client,
			Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: clk, LeaseDuration: 15 * time.Second,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			a.Run(ctx, 1)
		}()
		t.Cleanup(func() { cancel(); <-done })
		return a, func() { cancel(); <-done }
	}
	// A rollout a step: the old pod stops, a new one starts.
	const rollouts = 12
	for i := range rollouts {
		_, stop := start()
		waitFor(t, "the new replica's lease", func() bool { return countLeases(t, client) > i })
		stop()
		clk.Step(time.Minute)
	}
	require.Equal(t, rollouts, countLeases(t, client))
	crashing.Store(false)

	survivor, _ := start()
	waitFor(t, "the survivor's leaf", func() bool { return survivor.Leaf() != nil })
	for range 60 {
		clk.Step(time.Minute)
		waitWaiters(t, clk, 2)
	}
	waitFor(t, "the dead replicas' leases to be removed", func() bool { return countLeases(t, client) == 1 })
	survivor.replicas.mu.Lock()
	seen := len(survivor.replicas.seen)
	survivor.replicas.mu.Unlock()
	assert.Equal(t, 1, seen, "seen leases")
}

// TestAttackLeaseCollectionSparesTheLiving: collection must not delete the
// Lease of a replica that renews, even after this process was paused for
// far longer than ten lease durations; and where RBAC forbids deleting
// Leases it says so once and leaves them, without touching rotation.
func TestAttackLeaseCollectionSparesTheLiving(t *testing.T) {
	logs := klogtest.Capture(t)
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Name: "attack-leases-living", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "a",
		Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: clk, LeaseDuration: 15 * time.Second,
	})
	require.NoError(t, err)
	alive := newFakeReplica(t, client, clk, "alive", 15)
	dead := newFakeReplica(t, client, clk, "dead", 15)
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	dead.renew(a)
	alive.renew(a)

	clk.Step(time.Hour) // paused: nothing was seen for an hour
	waitWaiters(t, clk, 2)
	assert.Equal(t, 3, countLeases(t, client), "a pause made every other replica's Lease look long dead")

	for range 40 { // 200s: more than ten lease durations
		alive.renew(a)
		clk.Step(5 * time.Second)
		waitWaiters(t, clk, 2)
	}
	waitFor(t, "the dead replica's Lease to be removed", func() bool { return countLeases(t, client) == 2 })
	_, err = client.CoordinationV1().Leases("ns").Get(context.Background(), "ca-alive", metav1.GetOptions{})
	require.NoError(t, err, "the living replica's Lease was deleted")

	// RBAC without delete: said once, Leases stay, nothing else changes.
	forbidLeaseDeletes(client)
	ghost := newFakeReplica(t, client, clk, "ghost", 15)
	ghost.renew(a)
	for range 60 {
		clk.Step(15 * time.Second)
		waitWaiters(t, clk, 2)
	}
	assert.Equal(t, 3, countLeases(t, client))
	assert.Equal(t, 1, logs.Count("Cannot delete the Leases of replicas that are gone"))
	assert.NoError(t, a.LastError())
	assert.NotNil(t, a.Leaf())
}
