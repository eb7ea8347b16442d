package authority_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/tlstest"
)

// pubTarget is how the publisher names the webhook configuration it
// publishes to (cabundle.Target.String).
const pubTarget = `ValidatingWebhookConfiguration "wh"`

// pubDownWorld is two Authority replicas on one fake API server and one
// fake clock, each serving its leaf on 127.0.0.1 through a real TLS
// listener, with a caBundle publisher (writing a ValidatingWebhookConfiguration)
// in replica 0 only. Replica 0 can be stopped and started again, with or
// without its publisher, as a rollout that changes its configuration does.
type pubDownWorld struct {
	*emergencyWorld
	lifetime time.Duration
	mu       sync.Mutex
	cancel   []func() // per replica: stops its Run loops; nil when stopped
}

func newPubDownWorld(t *testing.T, lifetime time.Duration) *pubDownWorld {
	ew := &emergencyWorld{t: t, client: fake.NewClientset(), clk: clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))}
	enforceResourceVersions(ew.client)
	_, err := ew.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(context.Background(), &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "wh"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "wh.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "wh"}},
			SideEffects: ptrTo(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	w := &pubDownWorld{emergencyWorld: ew, lifetime: lifetime}
	w.replicas, w.cancel = make([]*authority.Authority, 2), make([]func(), 2)
	for r := range 2 {
		w.start(r, r == 0)
		n := r
		w.addrs = append(w.addrs, tlstest.Server(t, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			w.mu.Lock()
			a := w.replicas[n]
			w.mu.Unlock()
			_, _, c := a.CurrentParsedCertKeyContent()
			if c == nil {
				return nil, errors.New("no leaf yet")
			}
			return c, nil
		}}))
	}
	for range 20 {
		w.stepLive(time.Second, 0, 1)
	}
	w.await("the first CA published", func() bool { return len(w.published()) > 0 })
	return w
}

// start runs replica r (ID "r<r>"), with the publisher when publisher is set.
func (w *pubDownWorld) start(r int, publisher bool) {
	t := w.t
	a, err := authority.New(authority.Config{
		Name: fmt.Sprintf("pubdown-r%d", r), Namespace: "ns", SecretName: "ca", Client: w.client,
		ReplicaID: fmt.Sprintf("r%d", r), Hosts: []string{"localhost"}, Lifetime: w.lifetime, Clock: w.clk,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if publisher {
		p, err := cabundle.NewPublisher(cabundle.PublisherConfig{
			Source: a, KubeClient: w.client, Clock: w.clk,
			Targets: []cabundle.Target{{Kind: cabundle.ValidatingWebhookConfiguration, Name: "wh"}},
		})
		require.NoError(t, err)
		a.AddObserver(p)
		wg.Go(func() { p.Run(ctx, 1) })
	}
	wg.Go(func() { a.Run(ctx, 1) })
	stop := func() {
		cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(emergencyGuard):
			t.Error("Run did not return after its context ended")
		}
	}
	w.mu.Lock()
	w.replicas[r], w.cancel[r] = a, stop
	w.mu.Unlock()
	t.Cleanup(func() { w.stop(r) })
	w.await(fmt.Sprintf("replica %d's first leaf and status", r), func() bool { return a.Leaf() != nil && a.Status().Signing.Fingerprint != "" })
}

// stop stops replica r's Run loops (a graceful stop: it releases its Lease).
func (w *pubDownWorld) stop(r int) {
	w.mu.Lock()
	stop := w.cancel[r]
	w.cancel[r] = nil
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// stepLive is step without handshakes with a stopped replica.
func (w *pubDownWorld) stepLive(d time.Duration, live ...int) {
	w.clk.Step(d)
	w.settleLive(len(live))
	bundle := w.published()
	if len(bundle) == 0 {
		return // nothing published yet: no client can call
	}
	for _, n := range live {
		if err := w.handshake(w.addrs[n], bundle); err != nil {
			w.failed.Add(1)
			w.t.Errorf("at %s a client following the published caBundle failed to reach replica %d: %v", w.clk.Now().UTC().Format(time.RFC3339), n, err)
		}
	}
}

// settleLive is emergencyWorld.settle for live replicas only: it waits
// until the fake API server saw no new request and the clock's waiters
// stayed the same over consecutive looks.
func (w *pubDownWorld) settleLive(live int) {
	w.t.Helper()
	stable, last := 0, ""
	deadline := time.Now().Add(emergencyGuard)
	for stable < 30 {
		if time.Now().After(deadline) {
			w.t.Fatalf("never settled: %s actions/waiters (want %d waiters)", last, 2*live)
		}
		time.Sleep(200 * time.Microsecond)
		state := fmt.Sprint(len(w.client.Actions()), "/", w.clk.Waiters())
		if state == last && w.clk.Waiters() >= 2*live {
			stable++
		} else {
			stable = 0
		}
		last = state
	}
}

// TestPromotionWaitsForTargetsOfPublisherThatIsDown (issue 27 §4): the
// caBundle publisher runs on replica 0 only. Replica 0 stops while a
// rotation is due and stays down for longer than the minimum propagation
// delay (about 35 min here), until the rotation would stall. Replica 1 does
// not publish, yet it must not promote the successor, which the webhook's
// caBundle lacks: it waits, Stalled, naming the declared target in Status
// and in its readiness check. Once replica 0 is back and has published, the
// successor signs, and a client following the webhook's caBundle reaches
// every live replica at every step.
func TestPromotionWaitsForTargetsOfPublisherThatIsDown(t *testing.T) {
	w := newPubDownWorld(t, time.Hour)
	r1 := w.replicas[1]
	first := r1.Status().Signing
	// Shortly before the successor is due (CARenewBefore, 2h40m ahead of
	// the signing CA's end), replica 0 stops.
	publishAt := first.NotAfter.Add(-160 * time.Minute)
	for w.clk.Now().Before(publishAt.Add(-10 * time.Minute)) {
		w.stepLive(5*time.Minute, 0, 1)
	}
	w.stop(0)
	stoppedAt := w.clk.Now()
	var succ *authority.SuccessorStatus
	for {
		w.stepLive(time.Minute, 1)
		s := r1.Status()
		require.Equal(t, first.Fingerprint, s.Signing.Fingerprint,
			"replica 1 promoted the successor %v after replica 0, the only publisher, stopped %v ago, while the webhook's caBundle lacks it (holds it: %v)",
			s.Signing.Fingerprint, w.clk.Since(stoppedAt), holds(w.published(), s.Signing.Fingerprint))
		if s.Successor != nil {
			succ = s.Successor
		}
		if s.Phase == authority.PhaseStalled {
			break
		}
	}
	require.NotNil(t, succ)
	require.Greater(t, w.clk.Since(stoppedAt), 35*time.Minute+2*time.Minute, "down for longer than the delay")
	require.False(t, holds(w.published(), succ.Fingerprint), "the webhook's caBundle holds the successor although its publisher is down")
	s := r1.Status()
	require.Contains(t, s.Successor.Pending, "cabundle/"+pubTarget, "Status names the target")
	err := authority.RotationCheck(r1).Check(nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), pubTarget, "readiness names the target")
	require.Equal(t, 1.0, certmetricstest.Value(t, "evercert_ca_rotation_uncovered_targets", map[string]string{"provider": r1.Name()}), "the uncovered target counted")
	require.Equal(t, pubTarget, strings.SplitN(w.secret().Annotations[authority.CABundleTargetsAnnotation], " ", 2)[1], "the declaration in the Secret")

	// Replica 0 comes back: it publishes, confirms, and the successor
	// signs; the target holds it before any leaf it signed is served.
	w.start(0, true)
	for r1.Status().Signing.Fingerprint != succ.Fingerprint || w.replicas[0].Status().Signing.Fingerprint != succ.Fingerprint {
		w.stepLive(10*time.Second, 0, 1)
		require.True(t, w.clk.Now().Before(first.NotAfter), "the successor did not sign before the old CA expired")
		for n, a := range w.replicas {
			if a.Status().Signing.Fingerprint == succ.Fingerprint {
				require.True(t, holds(w.published(), succ.Fingerprint), "replica %d signs with the successor, which the webhook's caBundle lacks", n)
			}
		}
	}
	for range 5 {
		w.stepLive(10*time.Second, 0, 1)
	}
	require.Zero(t, r1.Status().UnsafeRotations, "a safe promotion")
	require.Equal(t, 0.0, certmetricstest.Value(t, "evercert_ca_rotation_uncovered_targets", map[string]string{"provider": r1.Name()}))
	require.Zero(t, w.failed.Load(), "failed handshakes of a client following the caBundle")
}

// TestTargetDeclarationLapses: an operator removes the publisher from
// replica 0's configuration (a restart without it) just after a successor
// was published. Nobody renews the declaration any more: the successor
// waits for the target, named in Status, until the declaration lapses
// (CARenewBefore - RenewBefore - PropagationDelay, at least a day, after
// its last renewal, plus the skew tolerance), then signs, before the
// rotation stalls, without counting an unsafe rotation, and the
// declaration leaves the Secret.
func TestTargetDeclarationLapses(t *testing.T) {
	t.Parallel() // see guard
	// A one-day leaf: an 8-day CA, CARenewBefore 64h, RenewBefore 8h,
	// delay 14h, lapse 64h-8h-14h = 42h, stalled 56h after the
	// publication, skew tolerance 1h.
	w := newPubDownWorld(t, 24*time.Hour)
	r1 := w.replicas[1]
	first := r1.Status().Signing
	for r1.Status().Successor == nil {
		w.stepLive(time.Hour, 0, 1)
	}
	succ := r1.Status().Successor
	declared := w.secret().Annotations[authority.CABundleTargetsAnnotation]
	at, target, _ := strings.Cut(declared, " ")
	require.Equal(t, pubTarget, target, "the declaration in the Secret")
	renewed, err := time.Parse(time.RFC3339, at)
	require.NoError(t, err)
	lapse := renewed.Add(42*time.Hour + time.Hour)
	// Removed from the configuration: replica 0 runs without it.
	w.stop(0)
	w.start(0, false)
	removedAt := w.clk.Now()
	for w.clk.Now().Before(lapse) {
		for n, a := range w.replicas {
			s := a.Status()
			require.Equal(t, first.Fingerprint, s.Signing.Fingerprint, "replica %d promoted %v after the publisher was removed, before its declaration lapsed at %s",
				n, w.clk.Since(removedAt), lapse.UTC().Format(time.RFC3339))
			if !w.clk.Now().Before(succ.SignsNoEarlierThan.Add(10 * time.Minute)) {
				require.Contains(t, s.Successor.Pending, "cabundle/"+pubTarget, "replica %d's Status names the target it waits for", n)
			}
		}
		w.stepLive(10*time.Minute, 0, 1)
	}
	for range 12 {
		w.stepLive(10*time.Minute, 0, 1)
	}
	for n, a := range w.replicas {
		s := a.Status()
		require.Equal(t, succ.Fingerprint, s.Signing.Fingerprint, "replica %d signs with the successor once the declaration lapsed", n)
		require.Zero(t, s.UnsafeRotations, "replica %d: a lapse is no unsafe rotation", n)
		require.NotEqual(t, authority.PhaseStalled, s.Phase)
	}
	require.NotContains(t, w.secret().Annotations, authority.CABundleTargetsAnnotation, "the lapsed declaration left the Secret")
}
