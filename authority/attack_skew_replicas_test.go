package authority

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/apitest"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
)

// writeCountingClient is one replica's view of the shared fake API server
// that counts the Secret writes this replica makes.
type writeCountingClient struct {
	kubernetes.Interface
	writes *atomic.Int64
}

// IsWatchListSemanticsUnSupported: the fake API server has no watch lists.
func (c writeCountingClient) IsWatchListSemanticsUnSupported() bool { return true }

func (c writeCountingClient) CoreV1() corev1client.CoreV1Interface {
	return writeCountingCore{c.Interface.CoreV1(), c.writes}
}

type writeCountingCore struct {
	corev1client.CoreV1Interface
	writes *atomic.Int64
}

func (c writeCountingCore) Secrets(ns string) corev1client.SecretInterface {
	return writeCountingSecrets{c.CoreV1Interface.Secrets(ns), c.writes}
}

type writeCountingSecrets struct {
	corev1client.SecretInterface
	writes *atomic.Int64
}

func (s writeCountingSecrets) Create(ctx context.Context, secret *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error) {
	s.writes.Add(1)
	return s.SecretInterface.Create(ctx, secret, opts)
}

func (s writeCountingSecrets) Update(ctx context.Context, secret *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	s.writes.Add(1)
	return s.SecretInterface.Update(ctx, secret, opts)
}

// skewWorld is three Authority replicas announcing themselves in Leases on
// one fake API server: two healthy ones (the first makes the CA) and one
// whose clock is off by offset, which counts its Secret writes.
type skewWorld struct {
	client        *fake.Clientset
	base          *clocktesting.FakeClock
	healthy       []*Authority
	skewed        *Authority
	skewedWrites  atomic.Int64
	firstCA       []byte
	loops         int
	secretWritesN *atomic.Int64
	recorder      *events.FakeRecorder
}

func newSkewWorld(t *testing.T, offset time.Duration) *skewWorld {
	t.Helper()
	return newSkewWorldClock(t, func(base *clocktesting.FakeClock) clock.WithTicker { return offsetClock{base, offset} })
}

// jumpClock is the shared fake clock shifted by an offset that the test
// changes: a clock that jumps.
type jumpClock struct {
	*clocktesting.FakeClock
	offset *atomic.Int64
}

func (c jumpClock) Now() time.Time                  { return c.FakeClock.Now().Add(time.Duration(c.offset.Load())) }
func (c jumpClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func newSkewWorldClock(t *testing.T, skewedClock func(*clocktesting.FakeClock) clock.WithTicker) *skewWorld {
	t.Helper()
	w := &skewWorld{client: fake.NewClientset(), base: clocktesting.NewFakeClock(testNow), recorder: certreporttest.NewRecorder()}
	optimistic(w.client)
	w.secretWritesN = secretWrites(w.client)
	start := func(id string, client kubernetes.Interface, clk clock.WithTicker) *Authority {
		cfg := Config{
			Name: t.Name() + "/" + id, Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: id,
			Hosts: []string{"localhost"}, Clock: clk,
		}
		if id == "skewed" {
			cfg.EventRecorder, cfg.EventObject = w.recorder, certreporttest.Pod
		}
		a, err := New(cfg)
		require.NoError(t, err)
		runInBackground(t, a.Run)
		w.loops += 2 // the issuer's and the Lease loop's timers
		return a
	}
	w.healthy = append(w.healthy, start("healthy-0", w.client, w.base))
	waitFor(t, "the first CA", func() bool { return w.healthy[0].Leaf() != nil })
	w.healthy = append(w.healthy, start("healthy-1", w.client, w.base))
	waitFor(t, "the second healthy replica's leaf", func() bool { return w.healthy[1].Leaf() != nil })
	w.firstCA = w.secret(t).Data[corev1.TLSCertKey]
	w.skewed = start("skewed", writeCountingClient{w.client, &w.skewedWrites}, skewedClock(w.base))
	// Every replica has seen the others' Leases (the informers run on
	// real time).
	for _, a := range append(slices.Clone(w.healthy), w.skewed) {
		waitFor(t, a.Name()+" seeing the other replicas", func() bool {
			live := a.replicas.clocks(a.cfg.Clock.Now()).live
			// A replica that holds for skew from its start has no leaf, so
			// it signs no announcement and the others do not believe it.
			return live == 2 || a != w.skewed && live == 1 && w.skewed.Leaf() == nil
		})
	}
	w.settle(t)
	return w
}

func (w *skewWorld) secret(t *testing.T) *corev1.Secret {
	t.Helper()
	s, err := w.client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	return s
}

// settle waits until every loop sleeps on the clock again and nobody wrote
// the Secret for a while.
func (w *skewWorld) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for {
		waitWaiters(t, w.base, w.loops)
		before := w.secretWritesN.Load()
		time.Sleep(20 * time.Millisecond)
		if w.base.Waiters() >= w.loops && w.secretWritesN.Load() == before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replicas never settled: %d Secret writes, %d of %d loops asleep; %s",
				w.secretWritesN.Load(), w.base.Waiters(), w.loops, apitest.Recent(w.client.Actions(), apitest.RecentWindow))
		}
	}
}

// step moves the clock in steps of at most a minute (a third of the
// default lease duration, so every replica stays live) through d.
func (w *skewWorld) step(t *testing.T, d time.Duration) {
	t.Helper()
	for d > 0 {
		s := min(d, time.Minute)
		w.base.Step(s)
		d -= s
		w.settle(t)
	}
}

// checkHealthy checks that the healthy replicas serve leaves that complete
// real TLS handshakes against the Secret's bundle at the true time.
func (w *skewWorld) checkHealthy(t *testing.T) {
	t.Helper()
	bundle := w.secret(t).Data[dynamiccert.SecretCAKey]
	for _, a := range w.healthy {
		assert.NoError(t, handshakeWith(t, a, bundle, w.base.Now), "%s", a.Name())
	}
}

// checkSkewReported checks that the skewed replica says so: in Status, in
// its failing readiness check, in evercert_clock_skew_total and in one
// Warning Event.
func (w *skewWorld) checkSkewReported(t *testing.T, direction string) {
	t.Helper()
	s := w.skewed.Status()
	assert.Contains(t, s.ClockSkew, "this clock is "+direction)
	err := RotationCheck(w.skewed).Check(nil)
	if assert.Error(t, err, "readiness of the skewed replica") {
		assert.Contains(t, err.Error(), "clock skew")
	}
	assert.Equal(t, 1.0, certmetricstest.Value(t, "evercert_clock_skew_total", map[string]string{"provider": w.skewed.Name()}))
	var skewEvents []string
	for _, e := range certreporttest.Drain(w.recorder) {
		if strings.Contains(e, dynamiccert.ReasonClockSkew) {
			skewEvents = append(skewEvents, e)
		}
	}
	assert.Len(t, skewEvents, 1, "one Warning Event: %v", skewEvents)
	for _, a := range w.healthy {
		assert.Empty(t, a.Status().ClockSkew, "%s", a.Name())
		assert.NoError(t, RotationCheck(a).Check(nil), "%s", a.Name())
		assert.Equal(t, 0.0, certmetricstest.Value(t, "evercert_clock_skew_total", map[string]string{"provider": a.Name()}), "%s", a.Name())
	}
}

// TestAttackSkewLaggingReplicaNeverReplacesCA: one replica of three runs
// with its clock three hours (and a day) behind, beyond the default one-hour
// tolerance. It sees the shared CA as not yet valid. It used to make a new
// CA, count an unsafe rotation and write it into the Secret, which the
// healthy replicas then adopted: every client holding the published bundle
// failed with "certificate signed by unknown authority". The replica must
// suspect its own clock instead: no write, ever.
func TestAttackSkewLaggingReplicaNeverReplacesCA(t *testing.T) {
	for _, offset := range []time.Duration{-3 * time.Hour, -day} {
		t.Run(offset.String(), func(t *testing.T) {
			w := newSkewWorld(t, offset)
			w.step(t, 5*time.Minute) // a few Lease renewals
			assert.Zero(t, w.skewedWrites.Load(), "Secret writes by the replica whose clock lags")
			assert.Equal(t, string(w.firstCA), string(w.secret(t).Data[corev1.TLSCertKey]), "the shared CA was replaced")
			assert.Zero(t, w.skewed.Status().UnsafeRotations)
			w.checkHealthy(t)
			w.checkSkewReported(t, "behind")
			assert.Equal(t, string(w.secret(t).Data[dynamiccert.SecretCAKey]), string(w.skewed.CurrentCABundleContent()), "the skewed replica serves the Secret's bundle")
		})
	}
}

// TestAttackSkewLeadingReplicaWaitsForPeers is the mirror case: one replica
// of three runs a day (and three hours) ahead. Its clock reaches the
// successor's publication time first; it used to publish the successor,
// writing the Secret with its clock's time. It must leave the Secret to
// the replicas whose clocks agree.
func TestAttackSkewLeadingReplicaWaitsForPeers(t *testing.T) {
	for _, offset := range []time.Duration{3 * time.Hour, day} {
		t.Run(offset.String(), func(t *testing.T) {
			w := newSkewWorld(t, offset)
			signing := w.healthy[0].Status().Signing
			publishAt := signing.NotAfter.Add(-w.healthy[0].cfg.CARenewBefore)
			// To a few minutes before the true publication time: the
			// replica ahead is past it on its clock.
			w.base.Step(publishAt.Add(-5 * time.Minute).Sub(w.base.Now()))
			w.settle(t)
			w.step(t, 3*time.Minute)
			assert.Zero(t, w.skewedWrites.Load(), "Secret writes by the replica whose clock leads")
			assert.Zero(t, len(w.secret(t).Data[NextCertKey]), "a successor was published before its time")
			// The healthy replicas publish on time.
			w.step(t, 3*time.Minute)
			assert.NotEmpty(t, w.secret(t).Data[NextCertKey], "the healthy replicas publish the successor")
			assert.Zero(t, w.skewedWrites.Load(), "Secret writes by the replica whose clock leads")
			w.checkHealthy(t)
			w.checkSkewReported(t, "ahead")
		})
	}
}

// TestAttackSkewJumpKeepsLastLeaf: a replica that served a leaf like the
// others has its clock jump five days ahead, past its leaf's renewal time.
// It used to issue a leaf dated by that clock, which no client with the
// right time accepts. It must not write the Secret, must keep serving the
// leaf it had (still valid for those clients), and must say why.
func TestAttackSkewJumpKeepsLastLeaf(t *testing.T) {
	var offset atomic.Int64
	w := newSkewWorldClock(t, func(base *clocktesting.FakeClock) clock.WithTicker { return jumpClock{base, &offset} })
	waitFor(t, "the third replica's leaf", func() bool { return w.skewed.Leaf() != nil })
	w.settle(t)
	leaf := w.skewed.Leaf()
	offset.Store(int64(5 * day)) // past the leaf's renewal time on this clock
	w.step(t, 3*time.Minute)     // renewals: the others see the jump
	assert.Zero(t, w.skewedWrites.Load(), "Secret writes after the clock jumped")
	assert.True(t, leaf.Equal(w.skewed.Leaf()), "the leaf it served before the jump")
	bundle := w.secret(t).Data[dynamiccert.SecretCAKey]
	assert.NoError(t, handshakeWith(t, w.skewed, bundle, w.base.Now), "a client with the right time still accepts its leaf")
	w.checkSkewReported(t, "ahead")
	w.checkHealthy(t)
}

// TestAttackSkewRestartedReplicaListsPeersFirst: a replica whose clock is a
// day past the shared signing CA's expiry starts fresh (a node rebooted
// with a bad clock) while two healthy replicas announce themselves. Its
// first check, the synchronous RunOnce every server makes at start, ran
// before its Lease watch had listed anyone: with no peer known, its clock
// alone decided that the CA had expired and replaced it, the outage of the
// lagging case in reverse. It must list its peers before it decides, refuse
// to replace a CA that has expired only on its own clock, find its clock
// ahead once it has watched them renew, and write nothing.
func TestAttackSkewRestartedReplicaListsPeersFirst(t *testing.T) {
	w := &skewWorld{client: fake.NewClientset(), base: clocktesting.NewFakeClock(testNow), recorder: certreporttest.NewRecorder()}
	optimistic(w.client)
	w.secretWritesN = secretWrites(w.client)
	for _, id := range []string{"healthy-0", "healthy-1"} {
		a, err := New(Config{
			Name: t.Name() + "/" + id, Namespace: "ns", SecretName: "ca", Client: w.client, ReplicaID: id,
			Hosts: []string{"localhost"}, Clock: w.base,
		})
		require.NoError(t, err)
		runInBackground(t, a.Run)
		waitFor(t, id+"'s leaf", func() bool { return a.Leaf() != nil })
		w.healthy = append(w.healthy, a)
	}
	for _, a := range w.healthy {
		waitFor(t, a.Name()+"'s Lease", func() bool {
			l, err := w.client.CoordinationV1().Leases("ns").Get(context.Background(), a.replicas.leaseName, metav1.GetOptions{})
			return err == nil && l.Spec.RenewTime != nil
		})
	}
	ca := w.secret(t).Data[corev1.TLSCertKey]
	offset := w.healthy[0].Status().Signing.NotAfter.Sub(w.base.Now()) + day

	skewed, err := New(Config{
		Name: t.Name() + "/skewed", Namespace: "ns", SecretName: "ca", Client: writeCountingClient{w.client, &w.skewedWrites},
		ReplicaID: "skewed", Hosts: []string{"localhost"}, Clock: offsetClock{w.base, offset},
		EventRecorder: w.recorder, EventObject: certreporttest.Pod,
	})
	require.NoError(t, err)
	w.skewed = skewed
	require.NoError(t, skewed.RunOnce(context.Background()))
	assert.Zero(t, w.skewedWrites.Load(), "Secret writes by the restarted replica whose clock leads, at its first check")
	assert.Equal(t, string(ca), string(w.secret(t).Data[corev1.TLSCertKey]), "the shared CA was replaced")
	assert.Zero(t, skewed.Status().UnsafeRotations)

	// Its first check found the CA expired on its clock alone. Once it has
	// watched its peers renew, it also knows its clock leads.
	runInBackground(t, skewed.Run)
	w.loops = 6 // each replica's issuer and Lease loops
	w.step(t, 2*time.Minute)
	waitFor(t, "the restarted replica finding its clock ahead", func() bool {
		return strings.Contains(skewed.Status().ClockSkew, "this clock is ahead")
	})
	assert.Zero(t, w.skewedWrites.Load(), "Secret writes by the restarted replica whose clock leads")
	assert.Equal(t, string(ca), string(w.secret(t).Data[corev1.TLSCertKey]), "the shared CA was replaced")
	w.checkHealthy(t)
	w.checkSkewReported(t, "ahead")
}
