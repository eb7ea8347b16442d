//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
)

var servingLine = regexp.MustCompile(`serving on https://([0-9.:\[\]a-f]+)`)

// TestE2EExampleServerSecrets runs the example server as a subprocess with
// --tls-secret and with --ca-secret against a real kube-apiserver, each
// with a kubeconfig for a user that has only the RBAC the README lists.
func TestE2EExampleServerSecrets(t *testing.T) {
	t.Parallel() // reads no process-global metric: see main_test.go
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: "server"}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	setupNamespace(t, admin)
	grantSecret(t, admin, "server", "serving", []string{"get", "list", "watch"})
	grantSecret(t, admin, "server", "server-ca", []string{"get", "list", "watch", "update"}, "create")
	kubeconfig := writeKubeconfig(t, cluster.UserConfig("server"))
	bin := proctest.Build(t, "github.com/evercert/evercert/example/server")
	ctx := context.Background()
	secrets := admin.CoreV1().Secrets(ns)

	t.Run("tls-secret", func(t *testing.T) {
		first := newPair(t, "localhost")
		_, err := secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "serving"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, addr := proctest.Start(t, bin, servingLine, "--secure-port=0", "--kubeconfig="+kubeconfig, "--tls-secret="+ns+"/serving")
		assert.Equal(t, first.Cert.SerialNumber.String(), servedSerial(t, addr, "localhost"))

		next := newPair(t, "localhost")
		s, err := secrets.Get(ctx, "serving", metav1.GetOptions{})
		require.NoError(t, err)
		s.Data = map[string][]byte{"tls.crt": next.CertPEM, "tls.key": next.KeyPEM}
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return servedSerial(t, addr, "localhost") == next.Cert.SerialNumber.String() }, 2*time.Second, 5*time.Millisecond)
	})

	t.Run("ca-secret", func(t *testing.T) {
		bundleFile := filepath.Join(t.TempDir(), "ca.crt")
		_, addr := proctest.Start(t, bin, servingLine, "--secure-port=0", "--kubeconfig="+kubeconfig,
			"--ca-secret="+ns+"/server-ca", "--ca-bundle-file="+bundleFile)
		s, err := secrets.Get(ctx, "server-ca", metav1.GetOptions{})
		require.NoError(t, err, "the server created its CA secret")
		bundle, err := os.ReadFile(bundleFile)
		require.NoError(t, err)
		assert.Equal(t, string(s.Data["ca.crt"]), string(bundle), "--ca-bundle-file holds the secret's ca.crt")
		_, err = tlstest.Dial(addr, &tls.Config{ServerName: "localhost", RootCAs: tlstest.Pool(t, bundle)})
		require.NoError(t, err, "the leaf verifies against the CA kept in the secret")
	})
}
