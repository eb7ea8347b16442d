//go:build e2e

package e2e

import (
	"context"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/sni"
)

// TestE2EDualKeyTypesAuthority runs an Authority with an ECDSA and an RSA
// leaf against a real kube-apiserver, with the sni controller, both through
// their Run loops on a fake clock stepped through nine leaf lifetimes and a
// CA rotation. After every step a default Go client must get the ECDSA leaf
// and an RSA-only TLS 1.2 client the RSA leaf, both verified against ca.crt
// as the Secret publishes it, and the two leaves must be a pair renewed
// together (the same NotAfter).
func TestE2EDualKeyTypesAuthority(t *testing.T) {
	t.Parallel() // reads no process-global metric: see main_test.go
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: "webhook"}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	setupNamespace(t, admin)
	grantSecret(t, admin, "webhook", "dual-ca", []string{"get", "list", "watch", "update"}, "create")
	client := kubernetes.NewForConfigOrDie(cluster.UserConfig("webhook"))

	const lifetime = time.Hour
	clk := clocktesting.NewFakeClock(time.Now())
	a, err := authority.New(authority.Config{
		Name: "e2e-dual", Namespace: ns, SecretName: "dual-ca", Client: client,
		Hosts: []string{"webhook.test"}, Lifetime: lifetime, CALifetime: 4 * lifetime, Clock: clk,
		KeyTypes:                    []dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA2048},
		DisableReplicaAnnouncements: true, // this test is about key types, not replicas
	})
	require.NoError(t, err)
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: a, Clock: clk})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	require.NoError(t, a.RunOnce(ctx))
	wg.Go(func() { a.Run(ctx, 1) })
	wg.Go(func() { ctrl.Run(ctx, 1) })
	require.Eventually(t, ctrl.HasSynced, 30*time.Second, 10*time.Millisecond)
	addr := tlstest.Server(t, ctrl.TLSConfig())

	published := func() []byte {
		s, err := admin.CoreV1().Secrets(ns).Get(ctx, "dual-ca", metav1.GetOptions{})
		require.NoError(t, err)
		return s.Data["ca.crt"]
	}
	cas, err := pki.ParseCABundle(published())
	require.NoError(t, err)
	assert.IsType(t, &rsa.PublicKey{}, cas[0].PublicKey, "the CA is RSA, so RSA-only clients verify both chains")

	ecdsaSerials, rsaSerials, signingCAs := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for step := range 90 {
		clk.Step(lifetime / 10)
		var ecdsaLeaf, rsaLeaf *x509.Certificate
		require.Eventually(t, func() bool {
			roots := tlstest.Pool(t, published())
			var errE, errR error
			ecdsaLeaf, errE = tlstest.Handshake(addr, &tls.Config{ServerName: "webhook.test", RootCAs: roots, Time: clk.Now})
			rsaLeaf, errR = tlstest.Handshake(addr, &tls.Config{ServerName: "webhook.test", RootCAs: roots, Time: clk.Now,
				MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}})
			return errE == nil && errR == nil && ecdsaLeaf.PublicKeyAlgorithm == x509.ECDSA &&
				rsaLeaf.PublicKeyAlgorithm == x509.RSA && ecdsaLeaf.NotAfter.Equal(rsaLeaf.NotAfter)
		}, 30*time.Second, 10*time.Millisecond, "step %d: each client verifies its leaf against ca.crt, and the leaves are a pair", step)
		ecdsaSerials[ecdsaLeaf.SerialNumber.String()] = true
		rsaSerials[rsaLeaf.SerialNumber.String()] = true
		signingCAs[a.Status().Signing.Serial] = true
	}
	t.Logf("%d ECDSA leaves, %d RSA leaves, %d signing CAs", len(ecdsaSerials), len(rsaSerials), len(signingCAs))
	assert.Greater(t, len(ecdsaSerials), 10, "renewed at 2/3 of their life over nine lifetimes")
	assert.Len(t, rsaSerials, len(ecdsaSerials), "the two leaves rotate together")
	assert.GreaterOrEqual(t, len(signingCAs), 2, "through a CA rotation")
}
