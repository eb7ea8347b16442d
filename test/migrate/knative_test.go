package migrate

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/webhook/certificates/resources"

	"github.com/evercert/evercert/authority"
)

// TestMigrateFromKnative: knative's certificates are made for real by
// knative.dev/pkg's resources.CreateCerts and written to the Secret under
// its keys (resources.ServerKey, ServerCert, CACert) with an Update of the
// Secret read, as knative's certificate reconciler
// (webhook/certificates) does; the CA is injected into the webhook
// configuration from the Secret's resources.CACert, as knative's webhook
// reconciler does; the webhook serves tls.X509KeyPair(ServerCert,
// ServerKey), as knative's webhook GetCertificate does. (knative's
// reconcilers need knative's injection framework and informers; their
// steps are replicated here, the certificates are knative's own.) Then two
// evercert replicas adopt the Secret (LayoutKnative): they serve knative's
// leaf until their successor CA is observed, then switch to their own
// leaves. 0 failed calls across the switch and that first rotation.
func TestMigrateFromKnative(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	serverKey, serverCert, caCert, err := resources.CreateCerts(e.ctx, svcName, ns, time.Now().Add(3*time.Minute))
	require.NoError(t, err)
	secrets := e.client.CoreV1().Secrets(ns)
	s, err := secrets.Get(e.ctx, secretName, metav1.GetOptions{})
	require.NoError(t, err)
	s.Data = map[string][]byte{resources.ServerKey: serverKey, resources.ServerCert: serverCert, resources.CACert: caCert}
	_, err = secrets.Update(e.ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, e.injectCABundle(caCert))
	pair, err := tls.X509KeyPair(serverCert, serverKey)
	require.NoError(t, err)
	e.front.use(staticCert(&pair))
	e.waitForWebhook()

	e.migrate("knative", authority.LayoutKnative, func() {})
}

func staticCert(c *tls.Certificate) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c, nil }
}
