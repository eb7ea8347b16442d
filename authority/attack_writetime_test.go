package authority

import (
	"bytes"
	"context"
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/evercert/evercert/internal/pki"
)

// TestAttackReplayedLeaseWithOldWriteTimeSpeedsPromotion: someone allowed
// to update Leases (and to read them, to have recorded a version) writes a
// live replica's Lease back to a version that replica signed long ago,
// managedFields included. On a real API server that takes two updates: the
// replay, which the server stamps with the time of the write, then one that
// changes nothing but managedFields, which the server takes as given and
// does not stamp (no field changed); the tracker write below is their net
// result. A process that starts meanwhile has believed no announcement of
// that Lease, so the replay is its first sight: signed, chaining to the
// signing CA, renewTime older than the duration and the tolerance. Before
// replicaSet.expireDeadOnServerLocked it counted the replica live for the
// first-sight floor (two renewal intervals and the tolerance), in which the
// replica's next renewal arrives; now the old write time dates the Lease
// dead at once, and the new process promotes the successor the live
// replica does not hold. The security model says Lease write cannot speed
// a promotion up, and that forged write times need this process's clock to
// be ahead beyond the tolerance as well: a replayed signed version is
// another first sight that is old while its replica lives.
func TestAttackReplayedLeaseWithOldWriteTimeSpeedsPromotion(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	// Not NewClientset: it stamps managedFields on the wall clock, not on
	// clk, and the server's write times are what this test is about.
	client := fake.NewSimpleClientset()
	optimistic(client)
	stampServerTime(client, clk)
	config := func(id string) Config {
		return Config{Name: "attack-writetime-" + id, Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: id,
			Hosts: []string{"localhost"}, Lifetime: 10 * time.Minute, LeaseDuration: 20 * time.Second, Clock: clk}
	}
	a, err := New(config("a"))
	require.NoError(t, err)
	stuck := newFakeReplica(t, client, clk, "stuck", 20)
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	step := func(d time.Duration) {
		stuck.renew(a)
		clk.Step(d)
		waitWaiters(t, clk, 2)
	}
	stuck.renew(a)
	// What the attacker recorded: a genuine version of the live replica's
	// Lease, as the API server stored it.
	obj, err := client.Tracker().Get(leaseGVR, "ns", stuck.name)
	require.NoError(t, err)
	recorded := obj.(*coordinationv1.Lease).DeepCopy()
	require.NotEmpty(t, recorded.ManagedFields, "the server stamps the write time")

	for a.Status().Successor == nil {
		step(time.Minute)
	}
	// Past the delay of a process started now (the publication plus twice
	// the tolerance), so that only the live replica holds the successor.
	skew := a.Config().SkewTolerance
	succ := a.Status().Successor
	for clk.Now().Before(succ.SignsNoEarlierThan.Add(2*skew + time.Minute)) {
		step(5 * time.Second)
	}
	require.Equal(t, []string{"replica/stuck"}, a.Status().Successor.Pending)
	signing := secretSigningCert(t, client)

	// The replica renews (it is live), then the attacker writes the
	// recorded version back. The running replica believed later renewals,
	// so it rejects the replay as such.
	stuck.renew(a)
	obj, err = client.Tracker().Get(leaseGVR, "ns", stuck.name)
	require.NoError(t, err)
	replay := recorded.DeepCopy()
	replay.ResourceVersion = obj.(*coordinationv1.Lease).ResourceVersion + "0"
	require.NoError(t, client.Tracker().Update(leaseGVR, replay, "ns"))
	require.Greater(t, clk.Now().Sub(replay.Spec.RenewTime.Time), 20*time.Second+skew, "the replayed renewTime is past the duration and the tolerance")

	// A process starts (a rollout, a scale-up) while the replay is there.
	b, err := New(config("b"))
	require.NoError(t, err)
	runInBackground(t, b.Run)
	waitFor(t, "the new process's leaf", func() bool { return b.Leaf() != nil })
	waitWaiters(t, clk, 4)
	kickAndWait(t, b.issuer)

	require.True(t, bytes.Equal(signing, secretSigningCert(t, client)),
		"the successor signed while replica stuck, live (it renewed at %s, now) and without it, had its Lease replayed from %s: the new process took it for dead at first sight; its pending: %+v",
		clk.Now().Format(time.TimeOnly), replay.Spec.RenewTime.UTC().Format(time.TimeOnly), b.Status().Successor)
	require.Contains(t, b.Status().Successor.Pending, "replica/stuck", "the new process waits for the live replica")
}

// secretSigningCert is the signing CA's certificate (tls.crt) in the CA
// Secret.
func secretSigningCert(t *testing.T, client *fake.Clientset) []byte {
	t.Helper()
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	return s.Data["tls.crt"]
}

// TestRelistOrderDoesNotExpireALiveFirstSeenLease: expireDeadOnServerLocked
// takes the newest write time of any Lease seen as the API server's clock
// and trusts that "the stream is ordered, so no later renewal of the Lease
// can have been missed while a later write was seen". An informer's relist
// is not ordered by write: it delivers the list in key order (by name).
// Here a process saw peer p's Lease once (its first version), then was
// paused longer than the duration and the tolerance (a frozen cgroup, a
// starved VM) while p and peer a kept renewing; its watch expired, and the
// relist delivers a's latest renewal (ca-a) before p's (ca-p). Judged
// then, p's first version looks unrenewed for the whole pause on the
// server's clock, and p, live, is no longer waited for until the relist
// reaches its Lease: a check of the issuer that runs in between promotes a
// successor p does not hold; and since only live peers count as stale, the
// clock check that holds decisions after a pause until every stale peer
// renews (Authority.clockSkew) no longer waits for p either. Before, the
// pause did not count towards p's expiry (catchUpLocked).
func TestRelistOrderDoesNotExpireALiveFirstSeenLease(t *testing.T) {
	now := testNow
	clk := clocktesting.NewFakeClock(now)
	client := fake.NewClientset()
	ca, err := pki.NewCA(pki.Request{CommonName: "ca", Now: now, Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	_, err = client.CoreV1().Secrets("ns").Create(context.Background(), tlsSecret("ca", map[string][]byte{"tls.crt": ca.CertPEM, "tls.key": ca.KeyPEM}), metav1.CreateOptions{})
	require.NoError(t, err)
	successor, err := pki.NewCA(pki.Request{CommonName: "successor", Now: now, Lifetime: 24 * time.Hour})
	require.NoError(t, err)

	const duration, skew = 20 * time.Second, 5 * time.Second
	r := newReplicaSet(client, "ns", "ca", "r0", "test", duration, skew, clk)
	r.listed, r.roots, r.rootsKnown = true, []*x509.Certificate{ca.Cert}, true
	// lease is the peer id's Lease renewed at clk's now, as the API server
	// stores it: signed with a leaf of ca, stamped with the write time.
	lease := func(id string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca-" + id, Labels: map[string]string{LeaseLabel: "ca"},
				ResourceVersion: clk.Now().Format(time.RFC3339Nano),
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "evercert", Operation: metav1.ManagedFieldsOperationUpdate,
					Time: &metav1.Time{Time: clk.Now().Truncate(time.Second)}}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(id), LeaseDurationSeconds: ptr.To(int32(duration / time.Second)),
				RenewTime: &metav1.MicroTime{Time: clk.Now()}},
		}
		signAsReplica(t, client, l, clk.Now())
		return l
	}
	waitsForP := func() bool { return slices.Contains(r.pending(successor.Cert), "replica/p") }

	// The first list: a's and p's Leases, first seen.
	r.woke()
	r.observe(lease("a"))
	r.observe(lease("p"))
	r.asleep(duration / 3)
	require.True(t, waitsForP(), "p, just renewed, is waited for")

	// Paused past the duration and the tolerance; a and p renewed meanwhile.
	clk.Step(duration + skew + leaseMargin(duration, skew) + time.Minute)
	aLatest, pLatest := lease("a"), lease("p")
	clk.Step(time.Second)
	r.woke() // the run loop wakes first; the watch relists
	require.True(t, waitsForP(), "the pause does not count towards p's expiry")

	// The relist, in key order: ca-a before ca-p.
	// Until p's renewal is seen, p is waited for, and it is stale: the
	// clock check (Authority.clockSkew) holds every decision until each
	// stale live peer renews.
	r.observe(aLatest)
	waiting, stale := waitsForP(), r.clocks(clk.Now()).stale
	require.True(t, waiting && slices.Contains(stale, "p"),
		"p, live (renewed %v ago, its renewal next in the relist), is taken for dead because a's renewal was delivered first: waited for %v, stale peers %v",
		clk.Now().Sub(pLatest.Spec.RenewTime.Time), waiting, stale)
	r.observe(pLatest)
	require.True(t, waitsForP(), "p is waited for once its renewal is seen")
}
