package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/internal/pki"
)

// TestForeignWriterHoldsWithIgnoredCompromisedMark (simulator, seed 694:
// A2, ca.crt went from 1 to 5 of the old rotator's CAs in 90 s) is
// TestForeignWriterHoldsAfterHandledOperatorRequest for a compromised mark
// that names no CA of the Secret nor of the state in force: an operator's
// typo, or a CA the old rotator's rewrite replaced before any replica
// acted on the mark. The emergency ignores it (an Event) and never records
// it handled, and the old rotator's Update keeps it: counted as pending it
// turned the holds off for the rest of the overlap, every rewrite adopted
// at once with one CA more in ca.crt each.
func TestForeignWriterHoldsWithIgnoredCompromisedMark(t *testing.T) {
	a, old, client, clk, _ := holdingReplica(t, "ignored-mark")
	ctx := context.Background()
	other, err := pki.NewCA(pki.Request{CommonName: "never-in-the-secret", KeyType: pki.ECDSAP256, Now: clk.Now(), Lifetime: time.Hour})
	require.NoError(t, err)
	s := getSecret(t, client).DeepCopy()
	s.Annotations[CompromisedCAAnnotation] = Fingerprint(other.Cert)
	_, err = client.CoreV1().Secrets("ns").Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	requireRewritesHeld(t, a, old, client, clk, "the ignored mark")
}
