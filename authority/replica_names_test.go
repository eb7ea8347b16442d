package authority

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/certmetrics"
)

// TestReplicasWithDifferentHostsWaitForEachOther: two replicas share one CA
// Secret with different Hosts (two Authorities on one Secret, or a rollout
// that adds a name). Replica r1's consumers have not loaded the successor.
// r0 must wait for r1 as for any replica: no successor signs before r1's
// consumers hold it, and no announcement is rejected. Before, each took the
// other's leaf, for other names, as a forgery: r0 did not wait for r1 and
// the successor signed while r1's clients lacked it (issue 27 §4).
func TestReplicasWithDifferentHostsWaitForEachOther(t *testing.T) {
	w := newSignWorldHosts(t, [][]string{{"localhost"}, {"localhost", "127.0.0.1"}})
	w.gates[1].close(t, w.replicas[1].CurrentCABundleContent())
	fp := w.untilSuccessor()
	delayEnds := w.delayEnds()
	for w.clk.Now().Before(delayEnds.Add(5 * time.Minute)) {
		w.step(5 * time.Second)
		require.False(t, w.signedBy(fp), "the successor signed before replica r1's consumers held it")
		require.Contains(t, w.replicas[0].Status().Successor.Pending, "replica/r1")
	}
	for _, a := range w.replicas {
		assert.Zero(t, rejected(t, a, certmetrics.AnnouncementForged), "%s rejected its peer's announcement as forged", a.Name())
	}
	s, err := w.client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"[localhost] []", "[localhost] [127.0.0.1]"}, parseReplicaNames(s))

	w.gates[1].openUp()
	w.untilSigned(fp)
}

// TestReplicaNamesList: the list keeps each set once, the newest last, and
// at most maxReplicaNameSets of them.
func TestReplicaNamesList(t *testing.T) {
	var sets []string
	require.True(t, addReplicaNames(&sets, "[a] []", nil))
	require.False(t, addReplicaNames(&sets, "[a] []", nil))
	require.False(t, addReplicaNames(&sets, "", nil))
	for i := range maxReplicaNameSets + 2 {
		addReplicaNames(&sets, string(rune('b'+i)), nil)
	}
	require.Len(t, sets, maxReplicaNameSets)

	// More sets in use than the bound: none in use is dropped, so the
	// replicas do not take turns dropping each other's (a write each,
	// for ever); only those no live replica announces go.
	inUse := func(set string) bool { return set != "unused" }
	sets = nil
	for i := range maxReplicaNameSets {
		addReplicaNames(&sets, fmt.Sprint(i), inUse)
	}
	addReplicaNames(&sets, "unused", inUse)
	require.True(t, addReplicaNames(&sets, "new", inUse))
	require.Len(t, sets, maxReplicaNameSets+1, "the unused set is dropped, every set in use kept")
	require.NotContains(t, sets, "unused")
	for i := range maxReplicaNameSets {
		require.False(t, addReplicaNames(&sets, fmt.Sprint(i), inUse), "set %d, listed already, written again", i)
	}
	s := &corev1.Secret{}
	writeReplicaNames(sets, s)
	assert.Equal(t, sets, parseReplicaNames(s))
	assert.Nil(t, parseReplicaNames(&corev1.Secret{}))
}

// TestMoreHostSetsThanTheBoundDoNotRewriteTheSecretInTurn: more Authorities
// with different Hosts on one Secret than ReplicaNamesAnnotation keeps
// (maxReplicaNameSets). Before, each replica that found its set missing
// added it and dropped the oldest, another replica's, which then did the
// same: the Secret was rewritten in turn without end. Sets that a live
// replica announces are kept now, so the replicas settle.
func TestMoreHostSetsThanTheBoundDoNotRewriteTheSecretInTurn(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	var replicas []*Authority
	for i := range maxReplicaNameSets + 2 {
		a := attackAuthority(t, client, clk, fmt.Sprintf("hosts-%d", i), func(c *Config) {
			c.Hosts = []string{fmt.Sprintf("h%d.example", i)}
			c.DisableReplicaAnnouncements = false
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx, 1) }()
		t.Cleanup(func() { cancel(); <-done })
		waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
		replicas = append(replicas, a)
	}
	for range 5 {
		clk.Step(time.Minute)
		// Two loops per replica (the issuer's and the Lease writer's);
		// a few writes per replica at most while the clock stands still.
		settle(t, clk, 2*len(replicas), client, writes, int64(3*len(replicas)), replicas...)
	}
	before := writes.Load()
	for range 10 {
		clk.Step(time.Minute)
		settle(t, clk, 2*len(replicas), client, writes, int64(3*len(replicas)), replicas...)
	}
	assert.Zero(t, writes.Load()-before, "Secret writes in 10 settled minutes")
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Len(t, parseReplicaNames(s), len(replicas), "every set in use is listed")
}
