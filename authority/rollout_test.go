package authority

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// rolloutWorld is n Authority replicas on one fake API server and one fake
// clock whose processes are replaced, as a Deployment's rollout or a crash
// loop replaces them: each restart cancels a replica's Run, waits for it to
// return and starts a new Authority in its place.
type rolloutWorld struct {
	t      *testing.T
	client *fake.Clientset
	clk    *clocktesting.FakeClock
	delay  time.Duration
	// id names replica r in its gen-th process.
	id   func(r, gen int) string
	gens []int
	pods []*rolloutPod
	// noLeafWait: start does not wait for the new process's leaf (one
	// that starts during an emergency may have none to serve at first).
	noLeafWait bool
}

type rolloutPod struct {
	a      *Authority
	cancel context.CancelFunc
	done   chan struct{}
}

func newRolloutWorld(t *testing.T, n int, delay time.Duration, id func(r, gen int) string) *rolloutWorld {
	return newRolloutWorldOn(t, fake.NewClientset(), clocktesting.NewFakeClock(testNow), n, delay, id)
}

// newRolloutWorldOn is newRolloutWorld on client and clk.
func newRolloutWorldOn(t *testing.T, client *fake.Clientset, clk *clocktesting.FakeClock, n int, delay time.Duration, id func(r, gen int) string) *rolloutWorld {
	optimistic(client)
	w := &rolloutWorld{t: t, client: client, clk: clk, delay: delay, id: id,
		gens: make([]int, n), pods: make([]*rolloutPod, n)}
	t.Cleanup(func() {
		for r := range w.pods {
			w.stop(r)
		}
	})
	for r := range n {
		w.start(r)
		w.settle()
	}
	return w
}

// start runs a new process for replica r and waits for its leaf.
func (w *rolloutWorld) start(r int) {
	w.t.Helper()
	obs := &testObserver{}
	obs.ok.Store(true)
	a, err := New(Config{
		Name: fmt.Sprintf("rollout-r%d", r), Namespace: "ns", SecretName: "ca", Client: w.client,
		ReplicaID: w.id(r, w.gens[r]), Hosts: []string{"localhost"}, Lifetime: time.Hour,
		PropagationDelay: w.delay, Observers: []Observer{obs}, Clock: w.clk,
	})
	require.NoError(w.t, err)
	w.gens[r]++
	ctx, cancel := context.WithCancel(context.Background())
	p := &rolloutPod{a: a, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		a.Run(ctx, 1)
	}()
	w.pods[r] = p
	if !w.noLeafWait {
		waitFor(w.t, "the new process's leaf", func() bool { return a.Leaf() != nil })
	}
}

// stop ends replica r's process gracefully (its Run's context ends) and
// waits for Run to return.
func (w *rolloutWorld) stop(r int) {
	w.t.Helper()
	p := w.pods[r]
	if p == nil {
		return
	}
	w.pods[r] = nil
	p.cancel()
	select {
	case <-p.done:
	case <-time.After(guard):
		w.t.Fatalf("replica %d: Run did not return after its context ended", r)
	}
}

// stampServerTime makes client's Lease writes carry the API server's time
// of the write in their managedFields, as a real server does on every
// write that changes a field, with its resolution of a second; clk is the
// server's clock. (fake.NewClientset stamps them itself, on the wall
// clock: use it on a fake.NewSimpleClientset.)
func stampServerTime(client *fake.Clientset, clk clock.PassiveClock) {
	stamp := func(obj runtime.Object) {
		l := obj.(*coordinationv1.Lease)
		l.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "evercert", Operation: metav1.ManagedFieldsOperationUpdate,
			Time: &metav1.Time{Time: clk.Now().Truncate(time.Second)}}}
	}
	client.PrependReactor("create", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		stamp(a.(clienttesting.CreateAction).GetObject())
		return false, nil, nil
	})
	client.PrependReactor("update", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		stamp(a.(clienttesting.UpdateAction).GetObject())
		return false, nil, nil
	})
}

// kill ends replica r's process as SIGKILL or an OOM kill would: its Lease
// stays as its last renewal left it, neither released nor deleted (the
// API refuses the process's last writes to it, and any delete of it).
func (w *rolloutWorld) kill(r int) {
	w.t.Helper()
	name := w.pods[r].a.replicas.leaseName
	for _, verb := range []string{"update", "delete"} {
		w.client.PrependReactor(verb, "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
			target := ""
			switch a := a.(type) {
			case clienttesting.UpdateAction:
				target = a.GetObject().(metav1.Object).GetName()
			case clienttesting.DeleteAction:
				target = a.GetName()
			}
			if target == name {
				return true, nil, errors.New("the process was killed")
			}
			return false, nil, nil
		})
	}
	w.stop(r)
	_, err := w.client.Tracker().Get(leaseGVR, "ns", name)
	require.NoError(w.t, err, "replica %d's Lease after the kill", r)
}

// restart replaces replica r's process.
func (w *rolloutWorld) restart(r int) {
	w.stop(r)
	w.start(r)
	w.settle()
}

func (w *rolloutWorld) live() []*Authority {
	var out []*Authority
	for _, p := range w.pods {
		if p != nil {
			out = append(out, p.a)
		}
	}
	return out
}

// settle waits until every live Run loop sleeps on the clock (the issuer's
// and the Lease writer's timers) and nothing moved on the fake API server
// over a few consecutive looks.
func (w *rolloutWorld) settle() {
	w.t.Helper()
	pw := &promotionWorld{t: w.t, client: w.client, clk: w.clk, replicas: w.live()}
	pw.settle()
}

func (w *rolloutWorld) step(d time.Duration) {
	w.clk.Step(d)
	w.settle()
}

// secretCAs returns the signing CA's and the successor's certificates as
// the Secret holds them, and the successor's recorded publication time.
func (w *rolloutWorld) secretCAs() (signing, next []byte, published time.Time) {
	obj, err := w.client.Tracker().Get(secretGVR, "ns", "ca")
	require.NoError(w.t, err)
	s := obj.(*corev1.Secret)
	published, _ = time.Parse(time.RFC3339, s.Annotations[NextSinceAnnotation])
	return s.Data[corev1.TLSCertKey], s.Data[NextCertKey], published
}

// TestRollingRestartsNeverStallRotation: three replicas whose processes are
// all replaced, one after the other, every 45 % of the propagation delay
// (a Deployment rolled out more often than the delay, or pods that crash
// and restart that often), for three CA rotations. Every successor must
// still sign once its delay has passed since the publication recorded in
// the Secret (plus at most twice the skew tolerance, see delayStart),
// never earlier, no replica may ever report Stalled (the ca-rotation
// readiness check would fail on all of them at once), and no rotation may
// be unsafe. Before, each new process measured the delay again from its own
// first sight of the successor and announced it only after that, so the
// successor never signed while the old CA was valid.
//
// Both identities are tried: a new replica ID per process (a Deployment's
// pod names), and the same one (a StatefulSet's, or a container restarted
// in its pod: POD_NAME).
func TestRollingRestartsNeverStallRotation(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   func(r, gen int) string
	}{
		{"new-ids", func(r, gen int) string { return fmt.Sprintf("web-r%d-g%d", r, gen) }},
		{"same-ids", func(r, _ int) string { return fmt.Sprintf("web-r%d", r) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Lifetime 1h: CA 8h, successor published 160m before the
			// signing CA ends, leaf renew-before 20m, skew tolerance 5m.
			const delay = 35 * time.Minute
			w := newRolloutWorld(t, 3, delay, tc.id)
			skew := w.live()[0].Config().SkewTolerance
			restartEvery := delay * 45 / 100
			nextRoll := w.clk.Now().Add(restartEvery)
			signing, _, _ := w.secretCAs()
			var next []byte
			var published time.Time
			rotations, rolls := 0, 0
			for rotations < scenarioSize(1, 3) {
				require.False(t, w.clk.Now().After(testNow.Add(30*time.Hour)), "only %d rotations in 30 hours", rotations)
				w.step(time.Minute)
				if !w.clk.Now().Before(nextRoll) {
					for r := range w.pods {
						w.restart(r)
					}
					rolls++
					nextRoll = nextRoll.Add(restartEvery)
				}
				for _, a := range w.live() {
					s := a.Status()
					require.False(t, s.Stalled, "%s (%s) reports Stalled at %s: signing CA %s ends at %s, successor %+v",
						a.Name(), a.ReplicaID(), w.clk.Now().UTC().Format(time.RFC3339), s.Signing.Serial, s.Signing.NotAfter.UTC().Format(time.RFC3339), s.Successor)
					require.Zero(t, s.UnsafeRotations, "%s (%s): unsafe rotation", a.Name(), a.ReplicaID())
				}
				nowSigning, nowNext, nowPublished := w.secretCAs()
				if len(nowNext) > 0 && !bytes.Equal(nowNext, next) {
					next, published = nowNext, nowPublished
				}
				if !bytes.Equal(nowSigning, signing) {
					require.Equal(t, next, nowSigning, "the CA that signs now is not the published successor")
					require.False(t, w.clk.Now().Before(published.Add(delay)),
						"the successor published at %s signed at %s, before its propagation delay %v ended", published, w.clk.Now(), delay)
					lag := w.clk.Now().Sub(published.Add(delay))
					t.Logf("rotation %d: published %s, signs %v after its delay ended (skew tolerance %v), %d rollouts so far",
						rotations+1, published.Format(time.TimeOnly), lag, skew, rolls)
					require.LessOrEqual(t, lag, 2*skew+2*time.Minute, "the successor signed long after its delay ended")
					signing, next = nowSigning, nil
					rotations++
				}
			}
			// No Lease of a process that is gone is left behind.
			list, err := w.client.Tracker().List(leaseGVR, leaseGVK, "ns")
			require.NoError(t, err)
			require.Len(t, list.(*coordinationv1.LeaseList).Items, len(w.pods), "Leases after %d rollouts", rolls)
		})
	}
}

// TestGracefulShutdownDeletesLease: a replica whose Run's context ends
// deletes its Lease before Run returns, and its peer stops counting it as
// live (and so stops waiting for it) at once, not a lease duration later.
// Before, the Lease stayed, and every peer, and every process started
// during the next lease duration, counted it as a live replica.
func TestGracefulShutdownDeletesLease(t *testing.T) {
	w := newRolloutWorld(t, 2, 10*time.Minute, func(r, _ int) string { return fmt.Sprintf("r%d", r) })
	leaseName := replicaLeaseName("ca", "r0")
	_, err := w.client.Tracker().Get(leaseGVR, "ns", leaseName)
	require.NoError(t, err, "replica r0's Lease before shutdown")
	peer := w.pods[1].a
	// A CA nobody announces: every live replica is pending for it.
	unknown := peer.Leaf()
	require.Contains(t, peer.replicas.pending(unknown), "replica/r0", "r1 waits for r0 before it stops")

	w.stop(0)
	_, err = w.client.Tracker().Get(leaseGVR, "ns", leaseName)
	require.Error(t, err, "replica r0's Lease still exists after its Run returned")
	// The peer's watch delivers the release and the delete on real time:
	// the clock steps once it has (it came after the release).
	waitFor(t, "r1 to see r0's Lease deleted", func() bool {
		peer.replicas.mu.Lock()
		defer peer.replicas.mu.Unlock()
		l := peer.replicas.seen[leaseName]
		return l == nil || l.deleted
	})
	w.settle()
	w.step(2 * time.Second)
	require.NotContains(t, peer.replicas.pending(unknown), "replica/r0", "r1 still waits for the stopped r0 %v after it stopped", 2*time.Second)
	require.Zero(t, peer.replicas.clocks(w.clk.Now()).live, "r1 still counts the stopped r0 as live")
}

// TestReplicaIDFromPodName: without a ReplicaID, an Authority announces
// itself under POD_NAME, so a process restarted in the same pod (a crash,
// an OOM kill) takes over its own Lease instead of adding one that its
// peers count as a live replica, waited for, for a lease duration.
func TestReplicaIDFromPodName(t *testing.T) {
	t.Setenv("POD_NAME", "webhook-7d9f8-x2k4q")
	client := fake.NewClientset()
	optimistic(client)
	// A crash (SIGKILL, OOM) ends a process without its shutdown: it
	// neither releases nor deletes its Lease.
	var crashed atomic.Bool
	for _, verb := range []string{"update", "delete"} {
		client.PrependReactor(verb, "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
			if crashed.Load() {
				return true, nil, errors.New("the process was killed")
			}
			return false, nil, nil
		})
	}
	clk := clocktesting.NewFakeClock(testNow)
	for gen := range 2 {
		a, err := New(Config{
			Namespace: "ns", SecretName: "ca", Client: client, Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: clk,
		})
		require.NoError(t, err)
		require.Equal(t, "webhook-7d9f8-x2k4q", a.ReplicaID(), "process %d", gen)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx, 1) }()
		waitFor(t, "the Lease", func() bool {
			l, err := client.Tracker().Get(leaseGVR, "ns", replicaLeaseName("ca", "webhook-7d9f8-x2k4q"))
			leaf := a.Leaf()
			return err == nil && leaf != nil && *l.(*coordinationv1.Lease).Spec.HolderIdentity == "webhook-7d9f8-x2k4q" &&
				l.(*coordinationv1.Lease).Annotations[LeafAnnotation] == string(leafCertPEM(leaf))
		})
		list, err := client.Tracker().List(leaseGVR, leaseGVK, "ns")
		require.NoError(t, err)
		require.Len(t, list.(*coordinationv1.LeaseList).Items, 1, "process %d", gen)
		crashed.Store(gen == 0)
		cancel()
		select {
		case <-done:
		case <-time.After(guard):
			t.Fatal("Run did not return after its context ended")
		}
		crashed.Store(false)
	}
}

// TestKilledReplicasLeaseDoesNotStallRotationThroughRollouts: of three
// replicas one is killed (its Lease stays), and from then on a rollout
// replaces every process each 3 minutes, less than the first-sight floor
// (two renewal intervals and the skew tolerance, at most the lease
// duration and its margin: 4m here), so no process lives long enough to
// see the killed replica's Lease age out on its own clock. The next CA
// rotation must still happen on time: once the API server's own write
// times show the Lease unrenewed (a peer's renewal in the same stream of
// Leases is that much newer), a process that lists it takes it for dead
// (replicaSet.expireDeadOnServerLocked). Before, every new process counted
// it live for the floor and waited for it to announce the successor, which
// never signed while the old CA was valid (issue 27 §1; the simulator's
// gapDeadLease, seed 18726).
func TestKilledReplicasLeaseDoesNotStallRotationThroughRollouts(t *testing.T) {
	t.Parallel() // see guard
	clk := clocktesting.NewFakeClock(testNow)
	// NewClientset stamps managedFields on the wall clock, not on clk, and the
	// server's write times are what this test is about.
	client := fake.NewSimpleClientset()
	stampServerTime(client, clk)
	const delay = 35 * time.Minute
	w := newRolloutWorldOn(t, client, clk, 3, delay, func(r, gen int) string { return fmt.Sprintf("web-r%d-g%d", r, gen) })
	cfg := w.live()[0].Config()
	// A Lease first seen counts for at least this long (observeLocked).
	floor := min(cfg.LeaseDuration+leaseMargin(cfg.LeaseDuration, cfg.SkewTolerance), 2*cfg.LeaseDuration/3+cfg.SkewTolerance)
	rollEvery := 3 * time.Minute
	require.Less(t, rollEvery, floor, "the rollouts must come faster than the first-sight floor")

	killed := w.pods[0].a.ReplicaID()
	w.kill(0)
	w.pods, w.gens = w.pods[1:], w.gens[1:]
	signing, _, _ := w.secretCAs()
	var next []byte
	var published time.Time
	// The first rollout comes before the replicas that watched the killed
	// replica renew could see its Lease age out.
	nextRoll := w.clk.Now()
	rolls := 0
	for {
		for _, a := range w.live() {
			s := a.Status()
			require.False(t, s.Stalled, "%s reports Stalled at %s after %d rollouts every %v since %s was killed: successor %+v",
				a.ReplicaID(), w.clk.Now().Format(time.TimeOnly), rolls, rollEvery, killed, s.Successor)
		}
		nowSigning, nowNext, nowPublished := w.secretCAs()
		if len(nowNext) > 0 && !bytes.Equal(nowNext, next) {
			next, published = nowNext, nowPublished
		}
		if !bytes.Equal(nowSigning, signing) {
			require.Equal(t, next, nowSigning, "the CA that signs now is not the published successor")
			lag := w.clk.Now().Sub(published.Add(delay))
			t.Logf("the successor published at %s signed %v after its delay ended, through %d rollouts every %v since %s was killed",
				published.Format(time.TimeOnly), lag, rolls, rollEvery, killed)
			require.LessOrEqual(t, lag, 2*cfg.SkewTolerance+2*time.Minute, "the successor signed long after its delay ended")
			return
		}
		w.step(30 * time.Second)
		if !w.clk.Now().Before(nextRoll) {
			for r := range w.pods {
				w.restart(r)
			}
			rolls++
			nextRoll = nextRoll.Add(rollEvery)
		}
	}
}
