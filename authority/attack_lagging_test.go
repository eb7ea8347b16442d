package authority

import (
	"context"
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
	clocktesting "k8s.io/utils/clock/testing"
)

// blindClient is one replica's view of the shared fake API server: while
// blind is set, its reads of Secrets are forbidden (its own RBAC broke, its
// API endpoint is partitioned), while the other replicas read on.
type blindClient struct {
	kubernetes.Interface
	blind *atomic.Bool
}

func (c blindClient) CoreV1() corev1client.CoreV1Interface {
	return blindCore{c.Interface.CoreV1(), c.blind}
}

type blindCore struct {
	corev1client.CoreV1Interface
	blind *atomic.Bool
}

func (c blindCore) Secrets(ns string) corev1client.SecretInterface {
	return blindSecrets{c.CoreV1Interface.Secrets(ns), c.blind}
}

type blindSecrets struct {
	corev1client.SecretInterface
	blind *atomic.Bool
}

func (s blindSecrets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error) {
	if s.blind.Load() {
		return nil, forbidden()
	}
	return s.SecretInterface.Get(ctx, name, opts)
}

// waitLeasesSeen waits until every replica in rs has seen every other
// replica's Lease as the API server holds it. A replica counts another as
// live from the renewals its Lease watch delivered; that watch runs on the
// real clock, so a test that steps the fake clock by more than a Lease
// duration must wait for those deliveries, or a replica that renewed at
// every step looks dead to the others.
func waitLeasesSeen(t *testing.T, client *fake.Clientset, rs ...*Authority) {
	t.Helper()
	waitFor(t, "every replica to see the others' Leases", func() bool {
		leases, err := client.CoordinationV1().Leases("ns").List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		for _, r := range rs {
			for _, l := range leases.Items {
				if l.Name == r.replicas.leaseName {
					continue
				}
				want := l.ResourceVersion
				if l.Spec.RenewTime != nil {
					want += "/" + l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
				}
				r.replicas.mu.Lock()
				s := r.replicas.seen[l.Name]
				ok := s != nil && s.rv == want
				r.replicas.mu.Unlock()
				if !ok {
					return false
				}
			}
		}
		return true
	})
}

// TestAttackLaggingReplicaGetsItsDelay: replica b cannot read the CA
// Secret while a publishes a successor. The successor rightly waits for b,
// which is alive and does not announce it. When b can read again, it loads
// the successor and its observers confirm it at once; the successor then
// signed at once too, although clients that read b's bundle (the consumers
// the minimum delay is for) had no time at all to pick it up. Each replica
// must give its own consumers the minimum delay, counted from when it
// first saw the successor.
func TestAttackLaggingReplicaGetsItsDelay(t *testing.T) {
	t.Parallel() // see guard
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	var blind atomic.Bool
	mk := func(id string, c kubernetes.Interface) *Authority {
		a := attackAuthority(t, client, clk, "attack-lagging-"+id, func(cfg *Config) {
			cfg.Client = c
			cfg.DisableReplicaAnnouncements = false
			cfg.LeaseDuration = 30 * time.Second
		})
		runInBackground(t, a.Run)
		waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
		return a
	}
	a := mk("a", client)
	b := mk("b", blindClient{client, &blind})
	// Each step is longer than the Lease duration: the loops must have
	// finished their pass, and a must have seen b's renewal, or b, alive,
	// looks dead to a. (b's own watches use blindClient, which hides the
	// fake's lack of watch-list support: they never sync, and b reads the
	// Secret only with GETs, as the test means.)
	settled := func() {
		t.Helper()
		waitWaiters(t, clk, 4)
		waitLeasesSeen(t, client, a)
	}
	settled()
	delay := a.cfg.PropagationDelay

	blind.Store(true)
	for a.Status().Successor == nil {
		clk.Step(time.Minute)
		settled()
	}
	succ := a.Status().Successor
	for clk.Now().Before(succ.SignsNoEarlierThan.Add(time.Hour)) {
		clk.Step(time.Minute)
		settled()
		st := a.Status()
		require.NotNil(t, st.Successor, "signed while b, alive, has not loaded it")
		require.Contains(t, st.Successor.Pending, "replica/attack-lagging-b")
	}
	require.Nil(t, b.Status().Successor, "b cannot have seen it")

	blind.Store(false)
	for b.Status().Successor == nil { // b backs off; its next retry reads
		clk.Step(time.Second)
		settled()
	}
	seenByB := b.Status().Successor.SignsNoEarlierThan.Add(-delay)
	bBundle := b.CurrentCABundleContent()
	for a.Status().Successor != nil || b.Status().Successor != nil {
		clk.Step(time.Minute)
		settled()
		if a.Status().Successor == nil || b.Status().Successor == nil {
			assert.False(t, clk.Now().Before(seenByB.Add(delay)),
				"the successor signed %s after b first had it, less than the minimum delay %s", clk.Now().Sub(seenByB), delay)
		}
		require.True(t, clk.Now().Before(seenByB.Add(2*delay)), "never signed")
	}
	for _, r := range []*Authority{a, b} {
		require.NoError(t, handshakeWith(t, r, bBundle, clk.Now), "a client holding b's bundle: %s", r.Name())
	}
	assert.Zero(t, a.Status().UnsafeRotations+b.Status().UnsafeRotations)
}
