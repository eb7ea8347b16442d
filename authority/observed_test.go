package authority

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/tlstest"
)

const day = 24 * time.Hour

// offsetClock is a replica's clock: the shared fake clock shifted by a
// fixed skew. Timers are relative, so they delegate unchanged.
type offsetClock struct {
	*clocktesting.FakeClock
	offset time.Duration
}

func (c offsetClock) Now() time.Time                  { return c.FakeClock.Now().Add(c.offset) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// testObserver is an Observer the test confirms by hand; it notifies its
// listeners when it changes, as real observers do.
type testObserver struct {
	listeners
	ok atomic.Bool
}

func (o *testObserver) Name() string                    { return "test-observer" }
func (o *testObserver) Observed(*x509.Certificate) bool { return o.ok.Load() }
func (o *testObserver) set(ok bool) {
	o.ok.Store(ok)
	o.notify()
}

var _ dynamiccertificates.Notifier = &testObserver{}

// handshake verifies what p serves against bundle at clk's time, through a
// real TLS handshake on 127.0.0.1.
func handshakeWith(t *testing.T, p dynamiccertificates.CertKeyContentProvider, bundle []byte, now func() time.Time) error {
	t.Helper()
	cert, key := p.CurrentCertKeyContent()
	pair, err := tls.X509KeyPair(cert, key)
	require.NoError(t, err)
	addr := tlstest.Server(t, &tls.Config{Certificates: []tls.Certificate{pair}})
	_, err = tlstest.Handshake(addr, &tls.Config{ServerName: "localhost", RootCAs: tlstest.Pool(t, bundle), Time: now})
	return err
}

// TestSelfSignedPauseKeepsTrust is reproduction 1 of "Observed rotation":
// with default lifetimes, the clock steps 81 days at once (a suspended VM).
// The successor CA must be published but must not sign yet: a client
// holding the bundle published before the pause keeps verifying, although
// the leaf is now capped at the old CA's expiry. The successor signs once
// its minimum delay has passed, and no rotation is unsafe.
func TestSelfSignedPauseKeepsTrust(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	s, err := NewSelfSigned(SelfSignedConfig{Name: "pause-81d", Clock: clk})
	require.NoError(t, err)
	beforePause := s.CurrentCABundleContent()
	oldCA := s.Status().Signing
	runInBackground(t, s.Run)
	waitBlocked(t, clk)

	clk.Step(81 * day)
	waitFor(t, "the successor to be published", func() bool { return s.Status().Successor != nil })
	st := s.Status()
	assert.Equal(t, oldCA.Serial, st.Signing.Serial, "the observed CA keeps signing after the pause")
	require.NoError(t, handshakeWith(t, s, beforePause, clk.Now), "a client holding the pre-pause bundle must keep verifying")
	assert.Equal(t, oldCA.NotAfter, s.Leaf().NotAfter, "the leaf is capped at the old CA's expiry")
	atWake := s.CurrentCABundleContent()

	for s.Status().Successor != nil {
		require.Less(t, clk.Since(st.Successor.PublishedAt), 9*day, "the successor never signed before the old CA expired")
		clk.Step(time.Hour)
		waitBlocked(t, clk)
	}
	assert.GreaterOrEqual(t, clk.Since(st.Successor.PublishedAt), s.Config().PropagationDelay, "signed before its minimum delay")
	assert.Equal(t, st.Successor.Serial, s.Status().Signing.Serial)
	require.NoError(t, handshakeWith(t, s, atWake, clk.Now), "a client holding the bundle published at wake-up verifies the new leaf")
	assert.Zero(t, s.Status().UnsafeRotations)
}

// TestSelfSignedLongPauseIsOneUnsafeRotation: after 1.5 CA lifetimes no
// published CA is valid, so a fresh CA signs at once: exactly one unsafe
// rotation, in Status and in evercert_unsafe_rotations_total.
func TestSelfSignedLongPauseIsOneUnsafeRotation(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	s, err := NewSelfSigned(SelfSignedConfig{Name: "pause-1.5-ca", Clock: clk})
	require.NoError(t, err)
	before := certmetricstest.Value(t, "evercert_unsafe_rotations_total", map[string]string{"provider": s.Name()})
	runInBackground(t, s.Run)
	waitBlocked(t, clk)

	clk.Step(s.Config().CALifetime * 3 / 2)
	waitFor(t, "an unsafe rotation", func() bool { return s.Status().UnsafeRotations == 1 })
	waitBlocked(t, clk)
	for range 10 {
		clk.Step(day)
		waitBlocked(t, clk)
	}
	assert.Equal(t, 1, s.Status().UnsafeRotations)
	assert.Equal(t, before+1, certmetricstest.Value(t, "evercert_unsafe_rotations_total", map[string]string{"provider": s.Name()}))
	require.NoError(t, handshakeWith(t, s, s.CurrentCABundleContent(), clk.Now))
}

// TestSuccessorWaitsForObservers: a successor signs only once every
// observer confirms it, however long that takes; while it waits, Status
// names the observer, and once the old CA is near expiry the health check
// reports the stall. A confirmation promotes at once, without waiting for
// the next periodic check.
func TestSuccessorWaitsForObservers(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	obs := &testObserver{}
	s, err := NewSelfSigned(SelfSignedConfig{Name: "observed", Lifetime: time.Hour, Clock: clk, Observers: []Observer{obs}})
	require.NoError(t, err)
	cfg := s.Config()
	runInBackground(t, s.Run)
	waitBlocked(t, clk)
	check := RotationCheck(s)

	for s.Status().Successor == nil {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
	}
	signing := s.Status().Signing
	for clk.Now().Before(signing.NotAfter.Add(-cfg.RenewBefore)) {
		require.NoError(t, check.Check(nil))
		clk.Step(time.Minute)
		waitBlocked(t, clk)
		st := s.Status()
		require.NotNil(t, st.Successor, "promoted without the observer")
		require.Equal(t, []string{"test-observer"}, st.Successor.Pending)
	}
	assert.ErrorContains(t, check.Check(nil), "waits for test-observer")
	assert.True(t, s.Status().Stalled)
	assert.EqualValues(t, 1, certmetricstest.Value(t, "evercert_ca_rotation_pending_observers", map[string]string{"provider": s.Name()}))

	obs.set(true) // no clock step: the notification alone must promote
	waitFor(t, "promotion on the observer's notification", func() bool { return s.Status().Successor == nil })
	assert.NotEqual(t, signing.Serial, s.Status().Signing.Serial)
	require.NoError(t, check.Check(nil))
	assert.Zero(t, s.Status().UnsafeRotations)
}

// TestAuthoritySkewedReplicasShareCA is reproduction 2: two replicas share
// one Secret with clocks 10 minutes apart. The slower one must accept the
// CA the faster one made, not replace it.
func TestAuthoritySkewedReplicasShareCA(t *testing.T) {
	client := fake.NewClientset()
	base := clocktesting.NewFakeClock(testNow)
	newReplica := func(id string, offset time.Duration) *Authority {
		a, err := New(Config{
			Name: "skew-" + id, Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: id,
			Hosts: []string{"localhost"}, Lifetime: 24 * time.Hour, Clock: offsetClock{base, offset},
		})
		require.NoError(t, err)
		return a
	}
	fast, slow := newReplica("fast", 10*time.Minute), newReplica("slow", 0)
	runInBackground(t, fast.Run)
	waitFor(t, "the fast replica to create the CA", func() bool { return fast.Leaf() != nil })
	secret, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)

	runInBackground(t, slow.Run)
	waitFor(t, "the slow replica to serve", func() bool { return slow.Leaf() != nil })
	after, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, string(secret.Data["tls.crt"]), string(after.Data["tls.crt"]), "the slow replica replaced the shared CA")
	require.NoError(t, slow.Leaf().CheckSignatureFrom(mustParseBundle(t, secret.Data["tls.crt"])[0]))
	assert.Zero(t, slow.Status().UnsafeRotations)
	require.NoError(t, handshakeWith(t, slow, secret.Data["ca.crt"], base.Now))
}

// TestAuthorityWaitsForLiveReplicas: a successor waits for every replica
// whose Lease is live and does not announce it; a replica whose Lease
// expired is not waited for.
func TestAuthorityWaitsForLiveReplicas(t *testing.T) {
	t.Parallel() // see guard
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Name: "leases", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "a",
		Hosts: []string{"localhost"}, Lifetime: 10 * time.Minute, LeaseDuration: 20 * time.Second, Clock: clk,
	})
	require.NoError(t, err)
	leases := client.CoordinationV1().Leases("ns")
	// A replica that is alive but never loads the successor.
	stuck := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "ca-stuck", Namespace: "ns", Labels: map[string]string{LeaseLabel: "ca"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("stuck"), LeaseDurationSeconds: ptr.To[int32](20)},
	}
	_, err = leases.Create(context.Background(), stuck, metav1.CreateOptions{})
	require.NoError(t, err)
	var renewals atomic.Int64
	renew := func() {
		l, err := leases.Get(context.Background(), "ca-stuck", metav1.GetOptions{})
		require.NoError(t, err)
		l.Spec.RenewTime = &metav1.MicroTime{Time: clk.Now().Add(time.Duration(renewals.Add(1)) * time.Microsecond)}
		signAsReplica(t, client, l, clk.Now())
		_, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	waitFor(t, "its own lease", func() bool {
		l, err := leases.Get(context.Background(), replicaLeaseName("ca", "a"), metav1.GetOptions{})
		return err == nil && l.Annotations[TrustedCAsAnnotation] != ""
	})

	step := func() {
		// Renew every quarter of the lease duration, as replicas do (a
		// third); a renewal seen late must not make a live lease expire.
		renew()
		clk.Step(5 * time.Second)
		time.Sleep(time.Millisecond) // let watch events land; not a timing assertion
	}
	for a.Status().Successor == nil {
		step()
	}
	succ := a.Status().Successor
	for clk.Now().Before(succ.SignsNoEarlierThan.Add(5 * time.Minute)) {
		step()
		st := a.Status()
		require.NotNil(t, st.Successor, "promoted while a live replica does not have the successor")
		require.Contains(t, st.Successor.Pending, "replica/stuck")
	}
	// A replica announces a successor once its own minimum delay is over.
	waitFor(t, "own lease to announce the successor", func() bool {
		l, err := leases.Get(context.Background(), replicaLeaseName("ca", "a"), metav1.GetOptions{})
		return err == nil && bytes.Contains([]byte(l.Annotations[TrustedCAsAnnotation]), []byte(succ.Fingerprint))
	})
	waitFor(t, "only the stuck replica to be pending", func() bool {
		st := a.Status()
		return st.Successor != nil && len(st.Successor.Pending) == 1 && st.Successor.Pending[0] == "replica/stuck"
	})
	// The stuck replica stops renewing: once its lease expires it is not
	// waited for.
	for range 5 {
		clk.Step(10 * time.Second)
		time.Sleep(time.Millisecond)
	}
	waitFor(t, "promotion after the stuck replica's lease expired", func() bool {
		clk.Step(time.Second)
		return a.Status().Successor == nil
	})
	assert.Equal(t, succ.Serial, a.Status().Signing.Serial)
	assert.Zero(t, a.Status().UnsafeRotations)
}

// TestAuthorityRestoresLostSecret: the CA Secret deleted, then rolled back
// to older content (an etcd restore). The replica writes back the CAs it
// knows; clients holding the bundle keep verifying, and nothing is unsafe.
func TestAuthorityRestoresLostSecret(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Name: "restore", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "a",
		Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: clk, DisableReplicaAnnouncements: true,
	})
	require.NoError(t, err)
	secrets := client.CoreV1().Secrets("ns")
	watches := secretWatches(client)
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	waitFor(t, "the Secret watch", func() bool { return watches.Load() > 0 })
	orig, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)

	require.NoError(t, secrets.Delete(context.Background(), "ca", metav1.DeleteOptions{}))
	waitFor(t, "the Secret to be restored", func() bool {
		s, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
		return err == nil && bytes.Equal(s.Data["tls.crt"], orig.Data["tls.crt"])
	})

	// Rotate once, then roll the Secret back to the first content.
	first := a.Status().Signing.Serial
	for a.Status().Signing.Serial == first {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
	}
	newer, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	rolled := newer.DeepCopy()
	rolled.Data, rolled.Annotations = orig.Data, orig.Annotations
	_, err = secrets.Update(context.Background(), rolled, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor(t, "the rolled-back Secret to be restored", func() bool {
		s, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
		return err == nil && bytes.Equal(s.Data["tls.crt"], newer.Data["tls.crt"])
	})
	s, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, handshakeWith(t, a, s.Data["ca.crt"], clk.Now))
	require.NoError(t, handshakeWith(t, a, newer.Data["ca.crt"], clk.Now), "a client holding the bundle from before the rollback keeps verifying")
	assert.Zero(t, a.Status().UnsafeRotations)
}

var _ = sync.Mutex{}

// TestAuthoritySkewDoesNotShortenDelay: the replica whose clock is 30
// minutes behind publishes the successor; replicas at 0 and +30 min start
// right after (a 45-minute tolerance). The one ahead reads the publication
// time as an hour old, yet no replica may let the successor sign before the
// minimum delay has passed on the shared timeline.
func TestAuthoritySkewDoesNotShortenDelay(t *testing.T) {
	client := fake.NewClientset()
	base := clocktesting.NewFakeClock(testNow)
	const delay = 20 * time.Minute
	start := func(i int, offset time.Duration) *Authority {
		a, err := New(Config{
			Name: fmt.Sprintf("skew-delay-%d", i), Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: fmt.Sprint(i),
			Hosts: []string{"localhost"}, Lifetime: 6 * time.Hour, PropagationDelay: delay, SkewTolerance: 45 * time.Minute,
			Clock: offsetClock{base, offset}, DisableReplicaAnnouncements: true,
		})
		require.NoError(t, err)
		runInBackground(t, a.Run)
		waitFor(t, "replica to serve", func() bool { return a.Leaf() != nil })
		return a
	}
	secrets := client.CoreV1().Secrets("ns")
	get := func() map[string][]byte {
		s, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
		require.NoError(t, err)
		return s.Data
	}
	replicas := []*Authority{start(0, -30*time.Minute)}
	first := string(get()["tls.crt"])
	for len(get()[NextCertKey]) == 0 {
		base.Step(time.Minute)
		time.Sleep(time.Millisecond) // let the loop run; not a timing assertion
	}
	// When the publisher's loop published it, on the shared timeline (its
	// clock is 30 minutes behind): the test may notice a step late.
	s, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	since, err := time.Parse(time.RFC3339, s.Annotations[NextSinceAnnotation])
	require.NoError(t, err)
	published := since.Add(30 * time.Minute)
	replicas = append(replicas, start(1, 0), start(2, 30*time.Minute))
	for string(get()["tls.crt"]) == first {
		base.Step(time.Minute)
		time.Sleep(time.Millisecond)
	}
	assert.GreaterOrEqual(t, base.Since(published), delay, "the successor signed before the minimum delay on the shared timeline")
	for _, a := range replicas {
		assert.Zero(t, a.Status().UnsafeRotations)
	}
}

// TestAuthorityLeafValidOnItsOwnClock: replicas at −30 min and +30 min
// with a 45-minute tolerance (found by the e2e: a spread beyond the
// tolerance). The fast replica's successor is not yet valid on the slow
// replica's clock when it is promoted; the slow replica must keep serving
// a leaf that is valid on its own clock, never one its TLS stack rejects.
func TestAuthorityLeafValidOnItsOwnClock(t *testing.T) {
	client := fake.NewClientset()
	base := clocktesting.NewFakeClock(testNow)
	start := func(i int, offset time.Duration) (*Authority, offsetClock) {
		clk := offsetClock{base, offset}
		a, err := New(Config{
			Name: fmt.Sprintf("own-clock-%d", i), Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: fmt.Sprint(i),
			Hosts: []string{"localhost"}, Lifetime: 6 * time.Hour, PropagationDelay: 5 * time.Minute, SkewTolerance: 45 * time.Minute,
			Clock: clk, DisableReplicaAnnouncements: true,
		})
		require.NoError(t, err)
		runInBackground(t, a.Run)
		waitFor(t, "replica to serve", func() bool { return a.Leaf() != nil })
		return a, clk
	}
	slow, slowClk := start(0, -30*time.Minute)
	fast, _ := start(1, 30*time.Minute)
	first := fast.Status().Signing.Serial
	for fast.Status().Signing.Serial == first || slow.Status().Signing.Serial == first {
		base.Step(time.Minute)
		time.Sleep(time.Millisecond) // let the loops run; not a timing assertion
		leaf := slow.Leaf()
		require.False(t, slowClk.Now().Before(leaf.NotBefore), "the slow replica serves a leaf that is not valid yet on its own clock (NotBefore %v, now %v)", leaf.NotBefore, slowClk.Now())
	}
	waitFor(t, "the slow replica to move to the successor once it is valid on its clock", func() bool {
		base.Step(time.Minute)
		time.Sleep(time.Millisecond)
		leaf := slow.Leaf()
		require.False(t, slowClk.Now().Before(leaf.NotBefore))
		return leaf.CheckSignatureFrom(mustParseBundle(t, fast.CurrentCABundleContent())[len(mustParseBundle(t, fast.CurrentCABundleContent()))-1]) == nil
	})
	assert.Zero(t, slow.Status().UnsafeRotations)
}
