package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
)

// TestUnsafeRotationIsRecordedInTheSecret: every replica is down for longer
// than a CA's life and they wake together, so one of them makes a CA that
// signs before anyone observed it (an unsafe rotation). That replica then
// dies, taking its count (Status.UnsafeRotations,
// evercert_unsafe_rotations_total) with it. The other replica, which only
// saw the Secret change, and the dead one's replacement must still report
// the rotation, once, from the record written with the CA
// (UnsafeRotationsAnnotation), and a second one must count two (issue 27
// §4: "an unsafe rotation whose writer crashes before counting it is
// counted nowhere").
func TestUnsafeRotationIsRecordedInTheSecret(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	start := func(id string) (*Authority, context.CancelFunc) {
		a := attackAuthority(t, client, clk, "unsafe-record-"+id, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx, 1) }()
		stop := func() {
			cancel()
			<-done
		}
		t.Cleanup(stop)
		waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
		return a, stop
	}
	a, stopA := start("a")
	b, stopB := start("b")
	settle(t, clk, 2, client, writes, 3, a, b)
	require.Zero(t, b.Status().RecordedUnsafeRotations)

	clk.Step(12 * time.Hour) // the CA lives 8h: no observed CA is valid
	settle(t, clk, 2, client, writes, 6, a, b)
	writer, other, stopWriter := a, b, stopA
	if b.Status().UnsafeRotations == 1 {
		writer, other, stopWriter = b, a, stopB
	}
	require.Equal(t, 1, writer.Status().UnsafeRotations, "the writer counts it")
	require.Zero(t, other.Status().UnsafeRotations, "the other replica only saw the Secret change")
	signing := writer.Status().Signing.Fingerprint

	stopWriter() // dies: its count is gone
	c, _ := start("c")
	settle(t, clk, 2, client, writes, 3, other, c)
	for _, r := range []*Authority{other, c} {
		s := r.Status()
		assert.Equal(t, 1, s.RecordedUnsafeRotations, "%s: recorded unsafe rotations", r.Name())
		assert.Contains(t, s.LastUnsafeRotation, signing, "%s: the last one names the CA", r.Name())
		assert.Equal(t, 1.0, certmetricstest.Value(t, "evercert_unsafe_rotations_recorded", map[string]string{"provider": r.Name()}), "%s", r.Name())
	}
	assert.Equal(t, "1", secretAnnotation(t, client, UnsafeRotationsAnnotation))

	// Deleted by mistake: the replicas write back what they knew, the
	// record too.
	require.NoError(t, client.CoreV1().Secrets("ns").Delete(context.Background(), "ca", metav1.DeleteOptions{}))
	settle(t, clk, 2, client, writes, 3, other, c)
	assert.Equal(t, "1", secretAnnotation(t, client, UnsafeRotationsAnnotation), "the record, after the Secret was deleted")
	for _, r := range []*Authority{other, c} {
		assert.Equal(t, 1, r.Status().RecordedUnsafeRotations, "%s, after the Secret was deleted", r.Name())
	}

	// Ordinary rotations add nothing; a second unsafe one counts two.
	for range 12 {
		clk.Step(time.Hour)
		settle(t, clk, 2, client, writes, 6, other, c)
	}
	assert.Equal(t, "1", secretAnnotation(t, client, UnsafeRotationsAnnotation), "ordinary rotations are not unsafe")
	clk.Step(12 * time.Hour)
	settle(t, clk, 2, client, writes, 6, other, c)
	assert.Equal(t, "2", secretAnnotation(t, client, UnsafeRotationsAnnotation))
	for _, r := range []*Authority{other, c} {
		assert.Equal(t, 2, r.Status().RecordedUnsafeRotations, "%s", r.Name())
	}
}

func secretAnnotation(t *testing.T, client *fake.Clientset, key string) string {
	t.Helper()
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	return s.Annotations[key]
}

// TestUnsafeRecordParsing: a garbled or absent record starts the count over
// and never fails a check; the same CA is never counted twice.
func TestUnsafeRecordParsing(t *testing.T) {
	for _, v := range []string{"", "x", "-3"} {
		r := parseUnsafeRecord(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{UnsafeRotationsAnnotation: v}}})
		assert.Zero(t, r.count, "%q", v)
	}
	var r unsafeRecord
	require.True(t, r.add(testNow, "aa", "why"))
	require.False(t, r.add(testNow, "aa", "again"), "the same CA counted twice")
	require.True(t, r.add(testNow, "bb", string(make([]byte, 4096))))
	s := &corev1.Secret{}
	r.write(s)
	back := parseUnsafeRecord(s)
	assert.Equal(t, 2, back.count)
	assert.Equal(t, "bb", back.fingerprint)
	assert.LessOrEqual(t, len(s.Annotations[LastUnsafeRotationAnnotation]), maxUnsafeWhy+100, "the reason is bounded")
}
