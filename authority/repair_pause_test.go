package authority

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// TestRepairHeldAfterAPauseIsReported (simulator seed 15137, V1): a replica
// wakes from a pause longer than the skew tolerance and waits for the other
// replicas' next Lease renewals before it writes anything, to tell whether
// its clock agrees. That wait is no skew found, so ClockSkew stays empty.
// If ca.crt was garbled meanwhile, the repair this replica holds waits too,
// and a peer that is paused or killed stretches the wait to its Lease's
// end. Before, nothing said so: Status showed phase Signing, no error, and
// the broken Secret went unreported for as long as the peer was silent.
// Now Broken names the repair and the wait, and the repair is written as
// soon as the peer renews.
func TestRepairHeldAfterAPauseIsReported(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Name: "repair-pause", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "a",
		Hosts: []string{"localhost"}, Lifetime: time.Hour, LeaseDuration: time.Minute, SkewTolerance: 10 * time.Second, Clock: clk,
	})
	require.NoError(t, err)
	peer := newFakeReplica(t, client, clk, "peer", 60)
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	peer.renew(a)
	clk.Step(5 * time.Second)
	waitWaiters(t, clk, 2) // the issuer and the Lease loop

	// The pause: 40 s, beyond the tolerance, with no renewal seen.
	clk.Step(40 * time.Second)
	waitWaiters(t, clk, 2)
	// An operator's edit lands while the peer is silent.
	s := getSecret(t, client).DeepCopy()
	s.Data[dynamiccert.SecretCAKey] = []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
	_, err = client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)

	waitFor(t, "the held repair to be reported", func() bool {
		return strings.Contains(a.Status().Broken, "waits until its clock is checked")
	})
	st := a.Status()
	t.Logf("phase %s, Broken: %s", st.Phase, st.Broken)
	require.Equal(t, PhaseBroken, st.Phase)
	require.Empty(t, st.ClockSkew, "a wait for evidence, not a skew found")
	_, err = pki.ParseCABundle(getSecret(t, client).Data[dynamiccert.SecretCAKey])
	require.Error(t, err, "nothing is written while the clock is unchecked")

	// The peer renews: the clock is checked, the repair written.
	peer.renew(a)
	for n := 0; ; n++ {
		require.Less(t, n, 60, "ca.crt was not repaired after the peer renewed")
		if _, err := pki.ParseCABundle(getSecret(t, client).Data[dynamiccert.SecretCAKey]); err == nil {
			break
		}
		clk.Step(time.Second)
		waitWaiters(t, clk, 2)
	}
	waitFor(t, "Broken to clear", func() bool { return a.Status().Broken == "" })
}
