package authority

import (
	"context"
	"fmt"
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
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
)

// TestAttackSkewColdStartAfterDowntime: every replica was down for two
// hours (a Deployment scaled to zero overnight, a cluster outage). Nobody
// was left to collect their Leases, so a fresh replica's first list finds
// three Leases last renewed two hours ago. Seen once, a dead Lease and a
// live replica whose clock lags look alike; the fresh replica took the
// dead ones for three live replicas whose clocks lag, decided that its own
// (correct) clock leads, reported a clock skew (Warning Event, metric,
// failing readiness) and served nothing until they aged out. A Lease seen
// for the first time with a renewal beyond the tolerance must wait for its
// next renewal before it is evidence against this clock.
func TestAttackSkewColdStartAfterDowntime(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	base := clocktesting.NewFakeClock(testNow)
	for n := range 3 {
		id := fmt.Sprintf("gone-%d", n)
		_, err := client.CoordinationV1().Leases("ns").Create(context.Background(), &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: replicaLeaseName("ca", id), Namespace: "ns", Labels: map[string]string{LeaseLabel: "ca"}},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(id), LeaseDurationSeconds: ptr.To(int32(180)),
				RenewTime: &metav1.MicroTime{Time: base.Now().Add(-2 * time.Hour)},
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	recorder := certreporttest.NewRecorder()
	a, err := New(Config{
		Name: t.Name(), Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "fresh",
		Hosts: []string{"localhost"}, Clock: base, EventRecorder: recorder, EventObject: certreporttest.Pod,
	})
	require.NoError(t, err)
	require.NoError(t, a.RunOnce(context.Background()))
	assert.Empty(t, a.Status().ClockSkew, "a replica whose clock is right, next to Leases of replicas long gone")
	assert.Equal(t, 0.0, certmetricstest.Value(t, "evercert_clock_skew_total", map[string]string{"provider": a.Name()}))
	for _, e := range certreporttest.Drain(recorder) {
		assert.NotContains(t, e, dynamiccert.ReasonClockSkew)
	}
	// Once the dead Leases age out, it serves.
	runInBackground(t, a.Run)
	for a.Leaf() == nil {
		waitWaiters(t, base, 2)
		base.Step(time.Minute)
		assert.Empty(t, a.Status().ClockSkew)
	}
	assert.NoError(t, RotationCheck(a).Check(nil))
}
