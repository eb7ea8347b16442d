//go:build e2e

package testcluster_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/evercert/evercert/internal/testcluster"
)

func TestE2ECluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	c := testcluster.Start(t, testcluster.WithUsers(
		testcluster.User{Name: "alice", Groups: []string{"devs"}},
	))
	// The cluster's temporary directory appears in the etcd and
	// kube-apiserver command lines (--data-dir, --cert-dir, ...), so it
	// identifies this cluster's processes.
	dir := testcluster.Dir(c)
	if n := processesMentioning(t, dir); n != 2 {
		t.Fatalf("expected etcd and kube-apiserver running for %s, found %d processes", dir, n)
	}

	admin := clientset(t, c.Config())
	const ns = "testcluster-e2e"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: ns},
		StringData: map[string]string{"k": "v"},
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create secret: %v", err)
	}

	// Who am I, for the admin and for the token and certificate users.
	for _, tc := range []struct {
		name       string
		cfg        *rest.Config
		wantUser   string
		wantGroups []string
	}{
		{"admin", c.Config(), testcluster.AdminUser, []string{"system:masters"}},
		{"token user", c.UserConfig("alice"), "alice", []string{"devs"}},
		{"certificate user", c.UserConfig("bob", "qa"), "bob", []string{"qa"}},
	} {
		review, err := clientset(t, tc.cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: SelfSubjectReview: %v", tc.name, err)
		}
		got := review.Status.UserInfo
		if got.Username != tc.wantUser {
			t.Errorf("%s: user %q, want %q", tc.name, got.Username, tc.wantUser)
		}
		for _, g := range append(tc.wantGroups, "system:authenticated") {
			if !contains(got.Groups, g) {
				t.Errorf("%s: groups %v lack %q", tc.name, got.Groups, g)
			}
		}
	}

	// Non-admin users are authenticated but not authorized (RBAC).
	for _, cfg := range []*rest.Config{c.UserConfig("alice"), c.UserConfig("bob", "qa")} {
		_, err := clientset(t, cfg).CoreV1().Secrets(ns).Get(ctx, "s1", metav1.GetOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("get secret as non-admin: got %v, want Forbidden", err)
		}
	}

	// Front-proxy material: the client certificate chains to the CA and has
	// the allowed name.
	certPEM, keyPEM, caPEM := c.FrontProxy()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("front-proxy key pair: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("front-proxy CA PEM has no certificate")
	}
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("front-proxy client certificate does not verify: %v", err)
	}
	if pair.Leaf.Subject.CommonName != testcluster.FrontProxyClientName {
		t.Fatalf("front-proxy CN %q", pair.Leaf.Subject.CommonName)
	}
	// The kube-apiserver publishes the request-header configuration for
	// aggregated API servers.
	cm, err := admin.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get extension-apiserver-authentication: %v", err)
	}
	if got := cm.Data["requestheader-client-ca-file"]; strings.TrimSpace(got) != strings.TrimSpace(string(caPEM)) {
		t.Fatalf("requestheader-client-ca-file in kube-system/extension-apiserver-authentication does not match FrontProxy CA")
	}

	// Unreachable while stopped; the data survives a restart.
	c.StopAPIServer(t)
	if _, err := admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err == nil {
		t.Fatal("API server still answers after StopAPIServer")
	}
	c.StartAPIServer(t)
	if _, err := admin.CoreV1().Secrets(ns).Get(ctx, "s1", metav1.GetOptions{}); err != nil {
		t.Fatalf("get secret after StartAPIServer: %v", err)
	}
	c.RestartAPIServer(t)
	got, err := admin.CoreV1().Secrets(ns).Get(ctx, "s1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get secret after RestartAPIServer: %v", err)
	}
	if string(got.Data["k"]) != "v" {
		t.Fatalf("secret data after restart: %q", got.Data)
	}
	if _, err := clientset(t, c.UserConfig("alice")).CoreV1().Secrets(ns).Get(ctx, "s1", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("get secret as alice after restart: got %v, want Forbidden", err)
	}

	// Stop is idempotent and leaves nothing behind.
	c.Stop()
	c.Stop()
	if n := processesMentioning(t, dir); n != 0 {
		t.Fatalf("%d etcd/kube-apiserver processes for %s still running after Stop", n, dir)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("temporary directory %s still exists after Stop (stat: %v)", dir, err)
	}
	if _, err := http.Get(c.Host() + "/readyz"); err == nil {
		t.Fatal("API server still answers after Stop")
	}
}

func clientset(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("create clientset: %v", err)
	}
	return cs
}

// processesMentioning counts the processes whose command line contains s.
func processesMentioning(t *testing.T, s string) int {
	t.Helper()
	out, err := exec.Command("pgrep", "-f", s).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
			return 0 // pgrep: no process matched
		}
		t.Fatalf("pgrep -f %s: %v", s, err)
	}
	return len(strings.Fields(string(out)))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
