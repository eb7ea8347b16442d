package authority

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestEmergencyDoesNotPromoteSuccessorPublishedBeforeTheMark: a successor
// published before the signing CA was marked compromised (on schedule, or
// on a rotate request) had its key in the same Secret (next.key) as the
// compromised CA's: whoever read tls.key read next.key too. The emergency
// rotation must make a new successor (issue 21 §2: "a successor is made
// and published at once"), not promote that one.
func TestEmergencyDoesNotPromoteSuccessorPublishedBeforeTheMark(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	w := newOpsWorld(t, "emergency-pending-successor", client, clk)
	req := clk.Now().UTC().Format(time.RFC3339)
	w.annotate(RotateRequestedAnnotation, req)
	waitFor(t, "the rotate request to publish a successor", func() bool {
		return w.secret().Annotations[RotateHandledAnnotation] == req && w.a.Status().Successor != nil
	})
	exposed := w.a.Status().Successor.Fingerprint
	require.NotEmpty(t, w.secret().Data[NextKeyKey], "the pending successor's key is in the Secret")

	bad := w.a.Status().Signing.Fingerprint
	w.annotate(CompromisedCAAnnotation, bad, CompromisedReasonAnnotation, "the Secret leaked", CompromisedAtAnnotation, clk.Now().UTC().Format(time.RFC3339))
	marked := clk.Now()
	w.awaitMark(bad)
	for w.secret().Annotations[CompromisedHandledAnnotation] != bad {
		require.Less(t, clk.Since(marked), time.Minute, "the emergency was not handled within a minute (fake clock); status %+v", w.a.Status().Emergency)
		clk.Step(100 * time.Millisecond)
		waitBlocked(t, clk)
	}
	s := w.a.Status()
	require.NotEqual(t, exposed, s.Signing.Fingerprint, "the emergency promoted the successor whose key sat in the Secret beside the compromised CA's")
	w.a.mu.RLock()
	defer w.a.mu.RUnlock()
	for _, c := range w.a.cas.bundle {
		require.NotEqual(t, exposed, Fingerprint(c), "the successor exposed with the compromised CA is still in ca.crt")
	}
}
