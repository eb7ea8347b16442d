package authority

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
)

// opsWorld is one Authority replica (no Leases) with its Run loop, an
// observer that confirms everything and an Event recorder.
type opsWorld struct {
	t      *testing.T
	client *fake.Clientset
	clk    *clocktesting.FakeClock
	a      *Authority
	rec    *events.FakeRecorder
	cancel context.CancelFunc
	done   chan struct{}
}

func newOpsWorld(t *testing.T, name string, client *fake.Clientset, clk *clocktesting.FakeClock) *opsWorld {
	w := &opsWorld{t: t, client: client, clk: clk, rec: certreporttest.NewRecorder()}
	obs := &testObserver{}
	obs.ok.Store(true)
	w.a = attackAuthority(t, client, clk, name, func(c *Config) {
		c.EventRecorder, c.Observers = w.rec, []Observer{obs}
	})
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		w.a.Run(ctx, 1)
	}()
	t.Cleanup(w.stop)
	waitFor(t, "the leaf", func() bool { return w.a.Leaf() != nil })
	waitBlocked(t, clk)
	return w
}

func (w *opsWorld) stop() {
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(guard):
		w.t.Error("Run did not return after its context ended")
	}
}

func (w *opsWorld) secret() *corev1.Secret {
	s, err := w.client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(w.t, err)
	return s
}

func (w *opsWorld) annotate(kv ...string) {
	s := w.secret()
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	for n := 0; n < len(kv); n += 2 {
		s.Annotations[kv[n]] = kv[n+1]
	}
	_, err := w.client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(w.t, err)
}

// awaitMark waits until the replica has seen the compromised-ca mark on
// fingerprint. Its watch delivers the annotation on the real clock: a test
// that stepped the fake clock meanwhile would count that delivery's latency
// as fake time, and nothing but the watch brings the mark before the next
// check a check interval later.
func (w *opsWorld) awaitMark(fingerprint string) {
	w.t.Helper()
	waitFor(w.t, "the replica to see the compromised-ca mark", func() bool {
		e := w.a.Status().Emergency
		return e != nil && e.Fingerprint == fingerprint
	})
}

// events drains the recorder into what it holds so far, and those of reason.
func (w *opsWorld) events(reason string) []string {
	var out []string
	for _, e := range certreporttest.Drain(w.rec) {
		if strings.Contains(e, " "+reason+" ") {
			out = append(out, e)
		}
	}
	return out
}

// awaitEvents collects the Events with reason until there are at least n,
// for at most guard: an Event is recorded after the state it reports is
// visible (Status, the Secret), so a test that saw the state waits for it.
func (w *opsWorld) awaitEvents(reason string, n int) []string {
	w.t.Helper()
	var out []string
	deadline := time.Now().Add(guard)
	for {
		out = append(out, w.events(reason)...)
		if len(out) >= n || time.Now().After(deadline) {
			return out
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCompromisedFingerprintMatchingNoCAIsIgnored: a compromised-ca
// annotation that names no CA in the Secret is reported once (a Warning
// Event, counted) and changes nothing, however long it stays: no successor,
// no write, no rotation loop.
func TestCompromisedFingerprintMatchingNoCAIsIgnored(t *testing.T) {
	client := fake.NewClientset()
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	w := newOpsWorld(t, "emergency-bad-input", client, clk)
	signing := w.a.Status().Signing.Fingerprint
	before := writes.Load()
	w.annotate(CompromisedCAAnnotation, strings.Repeat("ab", 32), CompromisedReasonAnnotation, "typo")
	w.a.Enqueue()
	waitFor(t, "the bad fingerprint to be reported", func() bool {
		s := w.a.Status().Emergency
		return s != nil && s.Step == EmergencyIgnored
	})
	for range 30 {
		clk.Step(10 * time.Second)
		waitBlocked(t, clk)
	}
	s := w.a.Status()
	require.Nil(t, s.Successor, "a successor was published for a fingerprint that matches no CA")
	require.Equal(t, signing, s.Signing.Fingerprint)
	require.Equal(t, before+1, writes.Load(), "Secret writes besides the operator's annotation")
	require.Len(t, w.awaitEvents(dynamiccert.ReasonCARequestIgnored, 1), 1)
	require.Equal(t, 1.0, certmetricstest.Value(t, "evercert_operator_requests_total", map[string]string{"provider": w.a.Name(), "request": "compromised", "result": "ignored"}))
	require.Contains(t, s.Emergency.String(), "ignored")
}

// TestRotateRequestedActsOnce: a rotate-requested annotation publishes a
// successor at once (it then waits for its minimum delay as on schedule)
// and is recorded handled; a restart, and the successor's promotion, do not
// act on it again.
func TestRotateRequestedActsOnce(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	w := newOpsWorld(t, "rotate-now", client, clk)
	require.Nil(t, w.a.Status().Successor)
	req := clk.Now().UTC().Format(time.RFC3339)
	w.annotate(RotateRequestedAnnotation, req)
	waitFor(t, "the request to be handled", func() bool {
		return w.secret().Annotations[RotateHandledAnnotation] == req && w.a.Status().Successor != nil
	})
	succ := w.a.Status().Successor
	require.NotNil(t, succ, "no successor published on request")
	require.True(t, succ.SignsNoEarlierThan.After(clk.Now()), "a requested rotation keeps the minimum propagation delay")
	require.Len(t, w.awaitEvents(dynamiccert.ReasonCARotationRequested, 1), 1)
	w.stop()

	// A restart finds the request handled: the same successor waits.
	w2 := newOpsWorld(t, "rotate-now-restarted", client, clk)
	require.Equal(t, succ.Fingerprint, w2.a.Status().Successor.Fingerprint)
	for w2.a.Status().Successor != nil {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
	}
	require.Equal(t, succ.Fingerprint, w2.a.Status().Signing.Fingerprint)
	for range 10 {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
	}
	require.Nil(t, w2.a.Status().Successor, "the handled request published another successor")
	require.Empty(t, w2.events(dynamiccert.ReasonCARotationRequested))
}

// TestEmergencyStepsAreReported: each step of an emergency rotation is a
// Warning Event on the CA Secret, counted, and shown in Status(); the
// compromised CA leaves ca.crt without waiting for the minimum delay or
// its expiry.
func TestEmergencyStepsAreReported(t *testing.T) {
	client := fake.NewClientset()
	// resourceVersions, as a real API server keeps them: without them the
	// replica cannot tell whether its watch has delivered its own last
	// write, and a check that decided on the older content repeated a step
	// (each step is counted once).
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	w := newOpsWorld(t, "emergency-steps", client, clk)
	bad := w.a.Status().Signing
	w.annotate(CompromisedCAAnnotation, bad.Fingerprint, CompromisedReasonAnnotation, "leaked", CompromisedAtAnnotation, clk.Now().UTC().Format(time.RFC3339))
	marked := clk.Now()
	w.awaitMark(bad.Fingerprint)
	for w.secret().Annotations[CompromisedHandledAnnotation] != bad.Fingerprint {
		// MinReissueInterval holds the leaf's re-issue back for a moment.
		require.Less(t, clk.Since(marked), time.Minute, "the emergency was not handled within a minute (fake clock); status %+v", w.a.Status().Emergency)
		clk.Step(100 * time.Millisecond)
		waitBlocked(t, clk)
	}
	s := w.a.Status()
	require.NotEqual(t, bad.Fingerprint, s.Signing.Fingerprint)
	require.NotNil(t, s.Emergency)
	require.Equal(t, EmergencyDone, s.Emergency.Step, s.Emergency.String())
	require.Equal(t, "leaked", s.Emergency.Reason)
	evs := w.awaitEvents(dynamiccert.ReasonEmergencyCARotation, 4)
	require.GreaterOrEqual(t, len(evs), 4, "%v", evs)
	for _, e := range evs {
		require.True(t, strings.HasPrefix(e, corev1.EventTypeWarning), e)
	}
	for _, step := range []string{"published", "signing", "reissued", "untrusted"} {
		require.Equal(t, 1.0, certmetricstest.Value(t, "evercert_emergency_rotation_steps_total", map[string]string{"provider": w.a.Name(), "step": step}), step)
	}
	require.Equal(t, 0.0, certmetricstest.Value(t, "evercert_compromised_ca_trusted", map[string]string{"provider": w.a.Name()}))
	w.a.mu.RLock()
	defer w.a.mu.RUnlock()
	for _, c := range w.a.cas.bundle {
		require.NotEqual(t, bad.Fingerprint, Fingerprint(c), "the compromised CA is still in ca.crt")
	}
}
