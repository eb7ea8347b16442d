package authority

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestLeaseAgesRecord: the record of Leases watched unrenewed carries watch
// time only for the exact version it was written for. A line for a version
// this process saw change (the replica renewed), or for a Lease that is
// gone, is dropped and ages nothing; a line for the version this process
// sees ages it; a Lease not yet listed keeps its line for the others; a
// garbled line is ignored.
func TestLeaseAgesRecord(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	r := newReplicaSet(fake.NewClientset(), "ns", "ca", "me", "p", 3*time.Minute, 5*time.Minute, clk)
	r.woke()
	// Two believed announcements, as observe leaves them (what makes an
	// announcement believed is tested elsewhere).
	for name, rv := range map[string]string{"ca-dead": "7", "ca-renewed": "9"} {
		r.seen[name] = &seenLease{holder: strings.TrimPrefix(name, "ca-"), rv: rv + "/2030-01-01T00:00:00Z", version: rv,
			observedAt: clk.Now(), duration: r.duration}
	}
	version := func(name string) string { return r.seen[name].rv }
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{LeaseAgesAnnotation: strings.Join([]string{
		"ca-dead " + version("ca-dead") + " 400",
		"ca-renewed 8/2020-01-01T00:00:00Z 400", // an older version
		"ca-unlisted 3/2020-01-01T00:00:00Z 100",
		"garbled",
	}, "\n")}}}
	read := parseLeaseAges(s)
	require.Len(t, read, 3)

	out, grew := r.mergeLeaseAges(read, clk.Now(), true)
	require.False(t, grew, "nothing was watched overdue here yet")
	require.Equal(t, []leaseAge{
		{name: "ca-dead", version: version("ca-dead"), age: 400 * time.Second},
		{name: "ca-unlisted", version: "3/2020-01-01T00:00:00Z", age: 100 * time.Second},
	}, out, "the renewed Lease's line is stale; the unlisted one is kept")
	require.Equal(t, []string{"replica/renewed"}, r.pending(issueTestPair(t, "x", testNow, time.Hour).Cert),
		"the Lease aged by the record is dead; the renewed one is live")

	// Once listed, a line for a Lease that is not there is dropped; the
	// renewed Lease, watched unrenewed for half its duration, is added.
	r.listed = true
	r.asleep(time.Minute) // the run loop sleeps a renewal interval
	clk.Step(time.Minute)
	r.woke()
	r.asleep(time.Minute)
	clk.Step(30 * time.Second)
	out, grew = r.mergeLeaseAges(out, clk.Now(), true)
	require.True(t, grew)
	require.Equal(t, []leaseAge{
		{name: "ca-dead", version: version("ca-dead"), age: 400 * time.Second}, // recorded dead: not written again
		{name: "ca-renewed", version: version("ca-renewed"), age: 90 * time.Second},
	}, out)
	// While no successor waits, nothing holds on a Lease's liveness:
	// nothing is added.
	r.asleep(time.Minute)
	clk.Step(time.Minute)
	r.woke()
	_, grew = r.mergeLeaseAges(out, clk.Now(), false)
	require.False(t, grew, "recorded while no successor waits")

	written := &corev1.Secret{}
	writeLeaseAges(out, written)
	require.Equal(t, out, parseLeaseAges(written), "the record reads back as written")
}
