package authority

import (
	"bytes"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/apitest"
)

// promotionBound is how long, in simulated time, a successor may take to
// sign once its minimum propagation delay has ended on every replica and
// every observer holds it (issue 22: "promotion in seconds").
const promotionBound = 5 * time.Second

// promotionStep is how far the fake clock moves per step while a successor
// waits: the resolution of the promotion times measured.
const promotionStep = 250 * time.Millisecond

// promotionWorld is n Authority replicas with their Run loops on one fake
// API server and one fake clock, with the default lease and check
// settings, each with an observer that confirms everything (a caBundle
// publisher that has read its targets back).
type promotionWorld struct {
	t        *testing.T
	client   *fake.Clientset
	clk      *clocktesting.FakeClock
	replicas []*Authority
}

func newPromotionWorld(t *testing.T, n int, delay time.Duration, client kubernetes.Interface, fc *fake.Clientset) *promotionWorld {
	w := &promotionWorld{t: t, client: fc, clk: clocktesting.NewFakeClock(testNow)}
	for r := range n {
		obs := &testObserver{}
		obs.ok.Store(true)
		a, err := New(Config{
			Name: fmt.Sprintf("promotion-%d-r%d", n, r), Namespace: "ns", SecretName: "ca", Client: client,
			ReplicaID: fmt.Sprintf("r%d", r), Hosts: []string{"localhost"}, Lifetime: time.Hour,
			PropagationDelay: delay, Observers: []Observer{obs}, Clock: w.clk,
		})
		require.NoError(t, err)
		runInBackground(t, a.Run)
		waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
		w.replicas = append(w.replicas, a)
	}
	w.settle()
	return w
}

// loops is how many timers the replicas sleep on when idle: the issuer's
// and the Lease writer's.
func (w *promotionWorld) loops() int { return 2 * len(w.replicas) }

// settle waits until every Run loop sleeps on the clock and nothing moved
// on the fake API server over a few consecutive looks: the watch events a
// step caused have been handled.
func (w *promotionWorld) settle() {
	w.t.Helper()
	stable := 0
	last := ""
	deadline := time.Now().Add(guard)
	for stable < 5 {
		if time.Now().After(deadline) {
			w.t.Fatalf("the replicas never settled: %d of %d loops asleep; API state %s then %s; %s", w.clk.Waiters(), w.loops(), last, w.apiState(), apitest.Recent(w.client.Actions(), apitest.RecentWindow))
		}
		time.Sleep(200 * time.Microsecond)
		state := w.apiState()
		if w.clk.Waiters() >= w.loops() && state == last {
			stable++
		} else {
			stable = 0
		}
		last = state
	}
}

// apiState is the resourceVersions of the Secret and every Lease, and how
// many actions the fake API server has served.
func (w *promotionWorld) apiState() string {
	var b bytes.Buffer
	fmt.Fprint(&b, len(w.client.Actions()))
	if s, err := w.client.Tracker().Get(secretGVR, "ns", "ca"); err == nil {
		fmt.Fprint(&b, "/", s.(*corev1.Secret).ResourceVersion)
	}
	if list, err := w.client.Tracker().List(leaseGVR, leaseGVK, "ns"); err == nil {
		for _, l := range list.(*coordinationv1.LeaseList).Items {
			fmt.Fprint(&b, "/", l.Name, "@", l.ResourceVersion)
		}
	}
	return b.String()
}

func (w *promotionWorld) step(d time.Duration) {
	w.clk.Step(d)
	w.settle()
}

// signedBy reports whether a replica serves a leaf signed by the CA with
// fingerprint fp.
func (w *promotionWorld) signedBy(fp string) bool {
	for _, a := range w.replicas {
		a.mu.RLock()
		ok := a.leaf != nil && a.cas.signing != nil && Fingerprint(a.cas.signing.Cert) == fp && bytes.Equal(a.leafCA, a.cas.signing.Cert.Raw)
		a.mu.RUnlock()
		if ok {
			return true
		}
	}
	return false
}

// rotate steps the clock a minute at a time until a successor is
// published, then in promotionSteps until a leaf signed by it is served,
// and returns how long after the end of its minimum delay on every replica
// (each counts it from when it first saw the successor; the observers
// confirm at once) that was, in simulated time.
func (w *promotionWorld) rotate() time.Duration {
	w.t.Helper()
	var fp string
	for fp == "" {
		w.step(time.Minute)
		for _, a := range w.replicas {
			if s := a.Status().Successor; s != nil {
				fp = s.Fingerprint
			}
		}
	}
	var delayEnds time.Time
	began := w.clk.Now()
	for !w.signedBy(fp) {
		require.False(w.t, w.clk.Now().After(began.Add(24*time.Hour)), "no successor with a propagation delay appeared")
		for _, a := range w.replicas {
			if s := a.Status().Successor; s != nil && s.Fingerprint == fp && s.SignsNoEarlierThan.After(delayEnds) {
				delayEnds = s.SignsNoEarlierThan
			}
		}
		require.False(w.t, !delayEnds.IsZero() && w.clk.Now().After(delayEnds.Add(10*time.Minute)), "the successor never signed")
		w.step(promotionStep)
	}
	require.False(w.t, delayEnds.IsZero())
	for _, a := range w.replicas {
		require.Zero(w.t, a.Status().UnsafeRotations, a.Name())
	}
	return w.clk.Now().Sub(delayEnds)
}

// TestPromotionWithinSecondsOfTheDelay: with 2, 3 and 10 replicas running
// their Run loops, the default lease duration and check interval, and a 10
// s minimum delay, a successor signs within promotionBound of its minimum
// delay ending (every observer holds it by then). It guards the event-driven
// path: each issuer wakes by timer when its delay ends, announces at once
// (Lease written on the change, not at the next renewal), and every peer
// re-checks on the Lease watch event. (It passed before issue 22 too: the
// 20-30 s seen in a black-box run is not in this path.)
func TestPromotionWithinSecondsOfTheDelay(t *testing.T) {
	t.Parallel() // see guard
	for _, n := range promotionReplicas() {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			client := fake.NewClientset()
			optimistic(client)
			w := newPromotionWorld(t, n, 10*time.Second, client, client)
			var times []time.Duration
			for range 3 {
				times = append(times, w.rotate())
			}
			slices.Sort(times)
			t.Logf("promotion after the minimum delay ended, %d replicas, %d rotations: p50 %v, max %v (all: %v)", n, len(times), times[len(times)/2], times[len(times)-1], times)
			for _, d := range times {
				require.LessOrEqual(t, d, promotionBound, "a successor signed %v after its minimum delay ended on every replica", d)
			}
		})
	}
}

// promotionReplicas are the replica counts the promotion tests run: 3 and
// 10 replicas only under -authority.long (make soak); the simulator runs
// up to 10 in make test.
func promotionReplicas() []int {
	if *LongScenarios {
		return []int{2, 3, 10}
	}
	return []int{2}
}

var (
	secretGVR = corev1.SchemeGroupVersion.WithResource("secrets")
	leaseGVR  = coordinationv1.SchemeGroupVersion.WithResource("leases")
	leaseGVK  = coordinationv1.SchemeGroupVersion.WithKind("Lease")
)

// TestPromotionWithinSecondsOfAnOutage: the API server fails every request
// from just before a successor's minimum delay ends until a minute later.
// Once it answers again, the successor must sign within 10 s (simulated):
// the backoff the outage built up (up to backoff.DefaultCap) must not hold
// a confirmed successor back.
func TestPromotionWithinSecondsOfAnOutage(t *testing.T) {
	t.Parallel() // see guard
	const bound = 10 * time.Second
	for _, n := range promotionReplicas() {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			client := fake.NewClientset()
			optimistic(client)
			var down atomic.Bool
			for _, verb := range []string{"get", "list", "create", "update", "delete"} {
				client.PrependReactor(verb, "*", func(clienttesting.Action) (bool, runtime.Object, error) {
					if down.Load() {
						return true, nil, apierrors.NewServiceUnavailable("the API server is down")
					}
					return false, nil, nil
				})
			}
			w := newPromotionWorld(t, n, 10*time.Second, client, client)
			var fp string
			var delayEnds time.Time
			for fp == "" {
				w.step(time.Minute)
				for _, a := range w.replicas {
					if s := a.Status().Successor; s != nil {
						fp, delayEnds = s.Fingerprint, s.SignsNoEarlierThan
					}
				}
			}
			for w.clk.Now().Before(delayEnds.Add(-2 * time.Second)) {
				w.step(promotionStep)
			}
			down.Store(true)
			for range 240 { // a minute
				w.step(promotionStep)
			}
			require.False(t, w.signedBy(fp), "signed during the outage")
			down.Store(false)
			recovered := w.clk.Now()
			for !w.signedBy(fp) {
				require.False(t, w.clk.Now().After(recovered.Add(10*time.Minute)), "the successor never signed")
				w.step(promotionStep)
			}
			took := w.clk.Now().Sub(recovered)
			t.Logf("promotion after the API server answered again, %d replicas: %v", n, took)
			require.LessOrEqual(t, took, bound, "the successor signed %v after the API server answered again", took)
			for _, a := range w.replicas {
				require.Zero(t, a.Status().UnsafeRotations, a.Name())
			}
		})
	}
}
