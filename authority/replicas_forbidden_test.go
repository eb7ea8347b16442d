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

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
)

// TestReplicaLeaseWriteForbiddenIsReported: RBAC forbids one replica's
// Lease writes (create and update on leases.coordination.k8s.io) while its
// peer writes its own. The peer cannot wait for a replica it cannot see,
// so that replica's clients are at risk at the next rotation: its own
// Status must name the Lease and the denied verb, a metric must count the
// denied writes, until a write succeeds again. Its readiness stays green
// (RotationStatus.LeaseForbidden says why: RBAC denies every replica
// alike). Before the fix nothing but a log line said the Lease was
// forbidden.
func TestReplicaLeaseWriteForbiddenIsReported(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	deniedLease := replicaLeaseName("ca", "denied")
	var denying atomic.Bool
	var denied atomic.Int64
	denying.Store(true)
	for _, verb := range []string{"create", "update"} {
		client.PrependReactor(verb, "leases", func(action clienttesting.Action) (bool, runtime.Object, error) {
			obj := action.(interface{ GetObject() runtime.Object }).GetObject().(metav1.Object)
			if obj.GetName() != deniedLease || !denying.Load() {
				return false, nil, nil
			}
			denied.Add(1)
			return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), obj.GetName(), errors.New("RBAC: "+verb+" is not allowed"))
		})
	}
	newReplica := func(id string) *Authority {
		return attackAuthority(t, client, clk, "lease-forbidden-"+id, func(c *Config) {
			c.ReplicaID = id
			c.DisableReplicaAnnouncements = false
			c.LeaseDuration = 30 * time.Second
		})
	}
	peer, victim := newReplica("peer"), newReplica("denied")
	runInBackground(t, peer.Run)
	runInBackground(t, victim.Run)
	waitFor(t, "both leaves", func() bool { return peer.Leaf() != nil && victim.Leaf() != nil })
	waitFor(t, "the peer's Lease", func() bool {
		_, err := client.CoordinationV1().Leases("ns").Get(context.Background(), replicaLeaseName("ca", "peer"), metav1.GetOptions{})
		return err == nil
	})
	// The reactor counts the denial before the Lease writer has the error
	// back: wait for the writer to record it.
	waitFor(t, "the denied replica's first write reported", func() bool { return denied.Load() > 0 && victim.Status().LeaseForbidden != "" })

	lease := "ns/" + deniedLease
	st := victim.Status()
	assert.Contains(t, st.LeaseForbidden, "RBAC forbids create on this replica's Lease "+lease, "the victim's Status")
	require.NoError(t, RotationCheck(victim).Check(nil), "readiness: RBAC denies every replica alike, failing it would empty the Service")
	assert.Empty(t, peer.Status().LeaseForbidden)
	require.NoError(t, RotationCheck(peer).Check(nil), "the peer writes its Lease")
	metric := func(verb string) float64 {
		return certmetricstest.Value(t, "evercert_replica_lease_writes_forbidden_total", map[string]string{"provider": victim.Name(), "verb": verb})
	}
	assert.Positive(t, metric("create"))

	// The retries back off on the clock and each one is counted: the
	// condition lasts, and so does the metric's rate.
	before := metric("create")
	waitFor(t, "a retry of the denied create", func() bool {
		clk.Step(time.Second)
		return metric("create") > before
	})

	// RBAC fixed: the next attempt writes the Lease and clears it.
	denying.Store(false)
	waitFor(t, "the victim's Lease written", func() bool {
		clk.Step(time.Second)
		_, err := client.CoordinationV1().Leases("ns").Get(context.Background(), deniedLease, metav1.GetOptions{})
		return err == nil && victim.Status().LeaseForbidden == ""
	})
	require.NoError(t, RotationCheck(victim).Check(nil), "readiness once the Lease is written")

	// Forbidden again: the next renewal, an update, is denied.
	denying.Store(true)
	waitFor(t, "the denied renewal reported", func() bool {
		clk.Step(time.Second)
		return victim.Status().LeaseForbidden != ""
	})
	assert.Contains(t, victim.Status().LeaseForbidden, "RBAC forbids update on this replica's Lease "+lease)
	assert.Positive(t, metric("update"))
}
