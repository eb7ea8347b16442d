package migrate

import (
	"context"
	"testing"
	"time"

	cmtls "github.com/cert-manager/cert-manager/pkg/server/tls"
	cmauthority "github.com/cert-manager/cert-manager/pkg/server/tls/authority"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
)

// TestMigrateFromCertManager: cert-manager's webhook serving stack runs for
// real: a DynamicSource (what cert-manager's webhook serves from) on a
// DynamicAuthority, which writes its CA Secret; the test copies the
// Secret's ca.crt into the webhook configuration, as cert-manager's
// cainjector does for a configuration annotated
// cert-manager.io/inject-ca-from-secret (the cainjector itself is a
// controller binary, not run here). Then cert-manager stops and two
// evercert replicas adopt the Secret (LayoutCertManager) while the
// kube-apiserver calls the webhook: 0 failed calls across the switch and
// the first observed CA rotation after it.
func TestMigrateFromCertManager(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	src := &cmtls.DynamicSource{
		DNSNames: []string{dnsName},
		Authority: &cmauthority.DynamicAuthority{
			SecretNamespace: ns, SecretName: secretName, RESTConfig: e.cluster.Config(),
			CommonName: "cert-manager-webhook-ca", CADuration: 3 * time.Minute, LeafDuration: time.Minute,
		},
	}
	cmCtx, stopCM := context.WithCancel(e.ctx)
	cmDone := make(chan error, 1)
	go func() { cmDone <- src.Start(cmCtx) }()
	e.front.use(src.GetCertificate)

	// The cainjector's part, until cert-manager stops.
	injCtx, stopInj := context.WithCancel(e.ctx)
	injDone := make(chan struct{})
	go func() {
		defer close(injDone)
		for injCtx.Err() == nil {
			if s, err := e.client.CoreV1().Secrets(ns).Get(injCtx, secretName, metav1.GetOptions{}); err == nil && len(s.Data["ca.crt"]) > 0 {
				_ = e.injectCABundle(s.Data["ca.crt"])
			}
			select {
			case <-injCtx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	waitUntil(t, "cert-manager's source to serve", time.Minute, src.Healthy)
	e.waitForWebhook()

	e.migrate("cert-manager", authority.LayoutCertManager, func() {
		stopInj()
		<-injDone
		// cert-manager's webhook keeps serving the leaf it has until the
		// front switches; only its authority and renewals stop.
		leaf, err := src.GetCertificate(nil)
		if err != nil {
			t.Fatalf("cert-manager's leaf: %v", err)
		}
		e.front.use(staticCert(leaf))
		stopCM()
		<-cmDone
	})
}
