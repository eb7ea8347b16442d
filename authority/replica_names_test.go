package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	require.True(t, addReplicaNames(&sets, "[a] []"))
	require.False(t, addReplicaNames(&sets, "[a] []"))
	require.False(t, addReplicaNames(&sets, ""))
	for i := range maxReplicaNameSets + 2 {
		addReplicaNames(&sets, string(rune('b'+i)))
	}
	require.Len(t, sets, maxReplicaNameSets)
	s := &corev1.Secret{}
	writeReplicaNames(sets, s)
	assert.Equal(t, sets, parseReplicaNames(s))
	assert.Nil(t, parseReplicaNames(&corev1.Secret{}))
}
