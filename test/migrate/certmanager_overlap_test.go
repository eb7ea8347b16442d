package migrate

import (
	"bytes"
	"context"
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	cmtls "github.com/cert-manager/cert-manager/pkg/server/tls"
	cmauthority "github.com/cert-manager/cert-manager/pkg/server/tls/authority"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
)

// TestMigrateFromCertManagerWhileItRotates is TestMigrateFromCertManager
// with cert-manager still running while the evercert replicas start (issue
// 27 §8 bullet 1): its DynamicAuthority regenerates its CA as soon as
// ca.crt differs from tls.crt, which it does once evercert publishes a
// successor, and the cainjector stand-in keeps injecting that CA alone.
// The front keeps serving cert-manager's webhook (the replicas are not
// Ready) until cert-manager stops; see env.migrateWhileOldRuns.
func TestMigrateFromCertManagerWhileItRotates(t *testing.T) {
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

	// The cainjector's part, until cert-manager stops; it also counts
	// cert-manager's rewrites (a new CA alone in tls.crt and ca.crt).
	var rewrites atomic.Int64
	var lastCA atomic.Pointer[x509.Certificate]
	injCtx, stopInj := context.WithCancel(e.ctx)
	injDone := make(chan struct{})
	go func() {
		defer close(injDone)
		var last []byte
		for injCtx.Err() == nil {
			if s, err := e.client.CoreV1().Secrets(ns).Get(injCtx, secretName, metav1.GetOptions{}); err == nil && len(s.Data["ca.crt"]) > 0 {
				if bytes.Equal(s.Data["ca.crt"], s.Data["tls.crt"]) && !bytes.Equal(s.Data["tls.crt"], last) {
					last = s.Data["tls.crt"]
					lastCA.Store(parsePEM(t, last)[0])
					rewrites.Add(1)
				}
				_ = e.injectCABundle(s.Data["ca.crt"])
			}
			select {
			case <-injCtx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stopInj(); <-injDone })
	waitUntil(t, "cert-manager's source to serve", time.Minute, src.Healthy)
	e.waitForWebhook()

	e.migrateWhileOldRuns("cert-manager", authority.LayoutCertManager, time.Minute, func() (int64, *x509.Certificate) { return rewrites.Load(), lastCA.Load() }, func() {
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
