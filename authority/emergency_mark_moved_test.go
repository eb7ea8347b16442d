package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// TestMarkMovedToTheEmergencySuccessorNeverSigns: the operator
// marks the signing CA X compromised; the emergency publishes successor S,
// which waits for its observer. The operator then moves the mark to S (its
// key was kept in the same store, or it was the wrong CA to mark first).
// S is the operator's mark now, so it must never sign. But X is known
// compromised (known), so emergency.decide's own branch takes X for the CA
// to replace (fp = X), and S, the mark, is no longer seen as the marked
// successor (isNext is false) nor dropped as a pending one (it is
// ops.successor): it is promoted in place of X as soon as it is observed.
func TestMarkMovedToTheEmergencySuccessorNeverSigns(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	obs := &testObserver{}
	obs.ok.Store(true)
	a := attackAuthority(t, client, clk, "mark-moved", func(c *Config) { c.Observers = []Observer{obs} })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx, 1)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
	waitBlocked(t, clk)

	secret := func() *corev1.Secret {
		s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
		require.NoError(t, err)
		return s
	}
	annotate := func(kv ...string) {
		s := secret()
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		for n := 0; n < len(kv); n += 2 {
			s.Annotations[kv[n]] = kv[n+1]
		}
		_, err := client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	awaitMark := func(fp string) {
		waitFor(t, "the replica to see the mark", func() bool {
			e := a.Status().Emergency
			return e != nil && e.Fingerprint == fp
		})
	}

	// The successor the emergency makes waits: the observer lacks it.
	obs.set(false)
	x := a.Status().Signing.Fingerprint
	annotate(CompromisedCAAnnotation, x, CompromisedReasonAnnotation, "leaked", CompromisedAtAnnotation, clk.Now().UTC().Format(time.RFC3339))
	awaitMark(x)
	for a.Status().Successor == nil {
		clk.Step(time.Second)
		waitBlocked(t, clk)
	}
	s := a.Status().Successor.Fingerprint
	require.Equal(t, s, secret().Annotations[emergencySuccessorAnnotation], "the emergency's successor")
	require.Equal(t, x, a.Status().Signing.Fingerprint, "the emergency successor waits for the observer")

	// The operator moves the mark to the successor.
	annotate(CompromisedCAAnnotation, s, CompromisedAtAnnotation, clk.Now().UTC().Format(time.RFC3339))
	awaitMark(s)
	for range 5 {
		clk.Step(time.Second)
		waitBlocked(t, clk)
	}
	obs.set(true)
	for range 60 {
		clk.Step(time.Second)
		waitBlocked(t, clk)
	}

	// Every CA the Secret ever had in tls.crt.
	var signed []string
	for _, act := range client.Actions() {
		u, ok := act.(clienttesting.UpdateAction)
		if !ok || act.GetResource().Resource != "secrets" {
			continue
		}
		sec, ok := u.GetObject().(*corev1.Secret)
		if !ok || len(sec.Data[corev1.TLSCertKey]) == 0 {
			continue
		}
		cas, err := pki.ParseCABundle(sec.Data[corev1.TLSCertKey])
		require.NoError(t, err)
		signed = append(signed, Fingerprint(cas[0]))
	}
	require.NotContains(t, signed, s, "the successor the operator marked compromised was written as the signing CA (tls.crt); the CAs written signing: %v (first marked: %s); annotations %v",
		signed, x, secret().Annotations)
	require.NotEqual(t, x, a.Status().Signing.Fingerprint, "the first CA marked still signs")
}
