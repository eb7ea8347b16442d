package authority_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
)

// TestDeletedSecretKeepsTheDeclarations: while the only
// publisher (replica 0) is down and a successor waits for its target, the
// CA Secret is deleted (or rolled back to a backup taken before the
// declaration). Replica 1 writes back the CAs it knows, the successor and
// the unsafe record included, but not the declared targets: it then
// promotes the successor, which the webhook's caBundle lacks, once the
// delay is over.
func TestDeletedSecretKeepsTheDeclarations(t *testing.T) {
	t.Parallel() // see guard
	w := newPubDownWorld(t, time.Hour)
	r1 := w.replicas[1]
	first := r1.Status().Signing
	publishAt := first.NotAfter.Add(-160 * time.Minute)
	for w.clk.Now().Before(publishAt.Add(-10 * time.Minute)) {
		w.stepLive(5*time.Minute, 0, 1)
	}
	w.stop(0)
	for r1.Status().Successor == nil {
		w.stepLive(time.Minute, 1)
	}
	require.Contains(t, w.secret().Annotations, authority.CABundleTargetsAnnotation)
	require.NoError(t, w.client.CoreV1().Secrets("ns").Delete(context.Background(), "ca", metav1.DeleteOptions{}))
	deletedAt := w.clk.Now()
	for w.clk.Now().Before(first.NotAfter.Add(-5 * time.Minute)) {
		w.stepLive(time.Minute, 1)
		s := r1.Status()
		require.Equal(t, first.Fingerprint, s.Signing.Fingerprint,
			"replica 1 promoted the successor %v after the Secret was deleted while the only publisher is down; the webhook's caBundle holds it: %v; declarations in the Secret: %q",
			w.clk.Since(deletedAt), holds(w.published(), s.Signing.Fingerprint), w.secret().Annotations[authority.CABundleTargetsAnnotation])
	}
}
