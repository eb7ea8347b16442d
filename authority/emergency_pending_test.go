package authority_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
)

// TestEmergencyReplacesSuccessorPendingAtTheMark: three replicas with
// their Leases and a caBundle publisher. A rotate request publishes a
// successor, which every replica loads; its key is in the Secret beside
// the signing CA's. The signing CA is then marked compromised: the
// successor pending at the mark is exposed with it, so the emergency makes
// a new one. The exposed successor never signs, leaves ca.crt and the
// published caBundle, and no replica writes it back (each remembered it in
// its last state); a client following the caBundle never fails.
func TestEmergencyReplacesSuccessorPendingAtTheMark(t *testing.T) {
	w := newEmergencyWorld(t)
	req := w.clk.Now().UTC().Format(time.RFC3339)
	for {
		s := w.secret()
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[authority.RotateRequestedAnnotation] = req
		_, err := w.client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			require.NoError(t, err)
			break
		}
	}
	var exposed string
	w.await("every replica to load the requested successor", func() bool {
		first := w.replicas[0].Status().Successor
		if first == nil {
			return false
		}
		for _, a := range w.replicas {
			if s := a.Status().Successor; s == nil || s.Fingerprint != first.Fingerprint {
				return false
			}
		}
		exposed = first.Fingerprint
		return true
	})
	for range 5 {
		w.step(time.Second)
	}
	require.True(t, holds(w.secret().Data[dynamiccert.SecretCAKey], exposed), "the requested successor is in ca.crt before the mark")
	w.emergency()
	for range 10 {
		w.step(time.Second)
		require.False(t, holds(w.secret().Data[dynamiccert.SecretCAKey], exposed), "the successor exposed with the compromised CA is in ca.crt")
		require.False(t, holds(w.published(), exposed), "the successor exposed with the compromised CA is in the published caBundle")
		for n, a := range w.replicas {
			require.NotEqual(t, exposed, a.Status().Signing.Fingerprint, "replica %d signs with the successor exposed with the compromised CA", n)
			require.False(t, holds(a.CurrentCABundleContent(), exposed), "replica %d's bundle", n)
		}
	}
	require.Zero(t, w.failed.Load(), "failed handshakes of a client following the caBundle")
}
