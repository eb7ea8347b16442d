package authority

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestReplicaLeaseWatchFailureCountedOnce: RBAC lets a replica write its
// Lease but not list the Leases (a missing "list" verb). The informer
// retries the list with its backoff while the Lease keeps being renewed:
// the failing watch is one load failure, however many retries and
// successful renewals come in between. Before the fix the watch and the
// renewals shared one failure record, so each renewal cleared it and the
// next retry of the same list failure was counted, logged and evented
// again: the counter grew with every retry.
func TestReplicaLeaseWatchFailureCountedOnce(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	var lists atomic.Int64
	client.PrependReactor("list", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", errors.New("RBAC: list is not allowed"))
	})
	clk := clocktesting.NewFakeClock(testNow)
	const name = "lease-watch-forbidden"
	a := attackAuthority(t, client, clk, name, func(c *Config) {
		c.DisableReplicaAnnouncements = false
		c.LeaseDuration = 3 * time.Minute
	})
	runInBackground(t, a.Run)
	waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
	provider := name + "/replica-announcement"
	waitFor(t, "the first list failure counted", func() bool { return loadErrorCount(t, provider) >= 1 })

	// Renew the Lease (a minute is a third of its duration) while the
	// informer retries its list, until it has failed three more times.
	listed := lists.Load()
	renewals := 0
	require.Eventually(t, func() bool {
		clk.Step(time.Minute)
		renewals++
		return lists.Load() >= listed+3
	}, 60*time.Second, 200*time.Millisecond, "the informer retries its list")
	t.Logf("%d list failures, %d renewals", lists.Load(), renewals)
	assert.Equal(t, 1.0, loadErrorCount(t, provider), "one failing watch is one load failure")
}
