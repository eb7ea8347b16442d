package dynamiccert

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestAdoptSecretDeletedKeepsSuccessor: an adopted CA is not backdated
// (cert-manager's and knative's are not), so the successor published for
// it, backdated by the skew tolerance, has the earlier NotBefore. When the
// Secret is deleted while the successor waits to be observed, the replica
// writes back that successor, not a new one: a new one would restart the
// minimum delay and leave the first in ca.crt for nothing.
func TestAdoptSecretDeletedKeepsSuccessor(t *testing.T) {
	f := newForeignCA(t, "cert-manager-webhook-ca")
	client := fake.NewClientset(opaqueSecret(f.certManager()))
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	obs := &testObserver{} // holds the successor back
	a := runAdopting(t, client, clk, "adopt-cm-del", LayoutCertManager, func(c *AuthorityConfig) { c.Observers = []Observer{obs} })
	waitFor(t, "a leaf", func() bool { return a.Leaf() != nil })
	waitWaiters(t, clk, 1)
	published := getSecret(t, client).Data[AuthorityNextCertKey]
	require.NotEmpty(t, published, "the successor is published at once")

	require.NoError(t, client.CoreV1().Secrets("ns").Delete(context.Background(), "ca", metav1.DeleteOptions{}))
	waitFor(t, "the Secret written back", func() bool {
		s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
		return err == nil && len(s.Data[AuthorityNextCertKey]) > 0
	})
	waitWaiters(t, clk, 1)
	s := getSecret(t, client)
	assert.Equal(t, string(f.ca.CertPEM), string(s.Data["tls.crt"]), "the adopted CA still signs")
	assert.Equal(t, string(published), string(s.Data[AuthorityNextCertKey]), "the successor published is written back, not replaced by another")
	assert.Len(t, mustParseBundle(t, s.Data["ca.crt"]), 2, "ca.crt: the adopted CA and its one successor")
}
