package authority

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestRestartDoesNotDropHostSetsInUse (a review of the names fix):
// more Authorities with different Hosts on one Secret than
// ReplicaNamesAnnotation keeps, settled. One of them restarts with new
// Hosts (a rollout that changes them). The fix says a set a live replica
// announces is never dropped; the restarted process, whose Lease watch has
// not listed its peers yet, takes every set for unused and drops the
// others' (they are unlisted, so their announcements are held, not
// believed, until they add them back), and they re-add theirs, each
// dropping others': a cascade of writes after every such restart.
func TestRestartDoesNotDropHostSetsInUse(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	n := maxReplicaNameSets + 2
	replicas, cancels := make([]*Authority, n), make([]func(), n)
	start := func(i int, host string) {
		a := attackAuthority(t, client, clk, fmt.Sprintf("hosts-%d", i), func(c *Config) {
			c.Hosts = []string{host}
			c.DisableReplicaAnnouncements = false
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx, 1) }()
		var once sync.Once
		stop := func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(stop)
		waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
		replicas[i], cancels[i] = a, stop
	}
	for i := range n {
		start(i, fmt.Sprintf("h%d.example", i))
	}
	for range 5 {
		clk.Step(time.Minute)
		settle(t, clk, 2*n, client, writes, int64(3*n), replicas...)
	}
	// Replicas 1..n-1 run on throughout: their sets are in use.
	var mu sync.Mutex
	var dropped []string
	client.PrependReactor("update", "secrets", func(a clienttesting.Action) (bool, runtime.Object, error) {
		sets := parseReplicaNames(a.(clienttesting.UpdateAction).GetObject().(*corev1.Secret))
		mu.Lock()
		defer mu.Unlock()
		for i := 1; i < n; i++ {
			if set := leafNames([]string{fmt.Sprintf("h%d.example", i)}, nil); !slices.Contains(sets, set) && !slices.Contains(dropped, set) {
				dropped = append(dropped, set)
			}
		}
		return false, nil, nil
	})
	before := writes.Load()
	cancels[0]()
	start(0, "new.example")
	for range 5 {
		clk.Step(time.Minute)
		settle(t, clk, 2*n, client, writes, int64(3*n), replicas...)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, dropped, "sets of live replicas dropped from %s after one replica restarted with new Hosts (%d Secret writes)", ReplicaNamesAnnotation, writes.Load()-before)
}
