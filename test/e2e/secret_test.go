//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/sni"
)

const ns = "evercert-e2e"

func setupNamespace(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	_, err := admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// grantSecret lets user do verbs on the one Secret name (plus any extra
// namespace-wide verbs, which cannot be limited by name, such as create).
func grantSecret(t *testing.T, admin kubernetes.Interface, user, name string, verbs []string, namespaceVerbs ...string) {
	t.Helper()
	rules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{name}, Verbs: verbs}}
	if len(namespaceVerbs) > 0 {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: namespaceVerbs})
	}
	ctx := context.Background()
	_, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user + "-" + name}, Rules: rules}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: user + "-" + name},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

func newPair(t *testing.T, host string) *pki.Issued {
	t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: host + "-ca", Now: time.Now(), Lifetime: time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: host, DNSNames: []string{host}, Now: time.Now(), Lifetime: time.Hour})
	require.NoError(t, err)
	return leaf
}

// serve runs a controller over serving (and its Run loop) and a TLS server
// on 127.0.0.1 until the test ends.
func serve(t *testing.T, serving dynamiccertificates.CertKeyContentProvider) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: serving})
	require.NoError(t, err)
	var wg sync.WaitGroup
	if r, ok := serving.(dynamiccertificates.ControllerRunner); ok {
		require.NoError(t, r.RunOnce(ctx))
		wg.Go(func() { r.Run(ctx, 1) })
	}
	require.NoError(t, ctrl.RunOnce(ctx))
	wg.Go(func() { ctrl.Run(ctx, 1) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return tlstest.Server(t, ctrl.TLSConfig())
}

func servedSerial(t *testing.T, addr, host string) string {
	t.Helper()
	cert, err := tlstest.Dial(addr, &tls.Config{ServerName: host, InsecureSkipVerify: true})
	require.NoError(t, err)
	return cert.SerialNumber.String()
}

func TestE2ESecretSource(t *testing.T) {
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: "reader"}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	reader := kubernetes.NewForConfigOrDie(cluster.UserConfig("reader"))
	setupNamespace(t, admin)
	// get, list and watch on this one name are all the source needs.
	grantSecret(t, admin, "reader", "serving", []string{"get", "list", "watch"})

	ctx := context.Background()
	secrets := admin.CoreV1().Secrets(ns)
	write := func(data map[string][]byte) {
		t.Helper()
		s, err := secrets.Get(ctx, "serving", metav1.GetOptions{})
		require.NoError(t, err)
		s.Data = data
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	first := newPair(t, "svc.test")
	// Opaque, so the bad-input cases below get past the API's own
	// validation of kubernetes.io/tls Secrets.
	_, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "serving"}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	p, err := dynamiccert.NewSecretCertKey(dynamiccert.SecretConfig{Name: "e2e-secret", Namespace: ns, SecretName: "serving", Client: reader})
	require.NoError(t, err)
	addr := serve(t, p)
	require.Equal(t, first.Cert.SerialNumber.String(), servedSerial(t, addr, "svc.test"))

	// A write to the Secret is served within a second: no kubelet volume lag.
	var latencies []time.Duration
	for range 10 {
		next := newPair(t, "svc.test")
		start := time.Now()
		write(map[string][]byte{"tls.crt": next.CertPEM, "tls.key": next.KeyPEM})
		require.Eventually(t, func() bool { return servedSerial(t, addr, "svc.test") == next.Cert.SerialNumber.String() }, time.Second, 2*time.Millisecond)
		latencies = append(latencies, time.Since(start))
	}
	slices.Sort(latencies)
	t.Logf("secret write to served: p50 %v, max %v (10 writes)", latencies[len(latencies)/2], latencies[len(latencies)-1])
	good := newPair(t, "svc.test")
	write(map[string][]byte{"tls.crt": good.CertPEM, "tls.key": good.KeyPEM})
	require.Eventually(t, func() bool { return servedSerial(t, addr, "svc.test") == good.Cert.SerialNumber.String() }, time.Second, 2*time.Millisecond)

	other := newPair(t, "svc.test")
	for name, data := range map[string]map[string][]byte{
		"missing key":    {"tls.crt": other.CertPEM},
		"bad PEM":        {"tls.crt": []byte("garbage"), "tls.key": other.KeyPEM},
		"mismatched key": {"tls.crt": other.CertPEM, "tls.key": good.KeyPEM},
	} {
		before := certmetricstest.LoadErrors(t, "e2e-secret")
		write(data)
		// Bounded generously: what is checked is that the failure is
		// counted, not how fast.
		require.Eventually(t, func() bool { return certmetricstest.LoadErrors(t, "e2e-secret") > before }, 60*time.Second, 5*time.Millisecond, name)
		assert.ErrorContains(t, p.LastError(), ns+"/serving", name)
		assert.Equal(t, good.Cert.SerialNumber.String(), servedSerial(t, addr, "svc.test"), "%s: last good served", name)
	}

	require.NoError(t, secrets.Delete(ctx, "serving", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		err := p.LastError()
		return err != nil && err.Error() == "secret "+ns+"/serving was deleted"
	}, 60*time.Second, 5*time.Millisecond)
	assert.Equal(t, good.Cert.SerialNumber.String(), servedSerial(t, addr, "svc.test"), "deleted: last good served")

	// The API server goes away and comes back: still serving, then recovers.
	cluster.StopAPIServer(t)
	assert.Equal(t, good.Cert.SerialNumber.String(), servedSerial(t, addr, "svc.test"), "API server down: last good served")
	cluster.StartAPIServer(t)
	recreated := newPair(t, "svc.test")
	_, err = secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "serving"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": recreated.CertPEM, "tls.key": recreated.KeyPEM},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return servedSerial(t, addr, "svc.test") == recreated.Cert.SerialNumber.String() }, 30*time.Second, 10*time.Millisecond)
	assert.NoError(t, p.LastError())

	// RBAC limited to one name: any other Secret is forbidden, with a clear error.
	denied, err := dynamiccert.NewSecretCertKey(dynamiccert.SecretConfig{Namespace: ns, SecretName: "other", Client: reader})
	require.NoError(t, err)
	assert.ErrorContains(t, denied.RunOnce(ctx), "forbidden (RBAC must allow get, list and watch on this Secret)")
}

// TestE2EAuthorityReplicas starts three replicas at once against one CA
// Secret with lifetimes of seconds, and keeps TLS clients, which trust the
// bundle as published in the Secret, handshaking with every replica through
// several CA rotations.
func TestE2EAuthorityReplicas(t *testing.T) {
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: "webhook"}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	setupNamespace(t, admin)
	grantSecret(t, admin, "webhook", "webhook-ca", []string{"get", "list", "watch", "update"}, "create")
	client := kubernetes.NewForConfigOrDie(cluster.UserConfig("webhook"))

	ctx := context.Background()
	// Count writes to the Secret by watching it.
	watcher, err := admin.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=webhook-ca"})
	require.NoError(t, err)
	defer watcher.Stop()
	var writes atomic.Int64
	var mu sync.Mutex
	signing := map[string]bool{}
	maxBundle := 0
	go func() {
		for ev := range watcher.ResultChan() {
			s, ok := ev.Object.(*corev1.Secret)
			if !ok {
				continue
			}
			writes.Add(1)
			mu.Lock()
			signing[string(s.Data["tls.crt"])] = true
			if certs, err := pki.ParseCABundle(s.Data["ca.crt"]); err == nil {
				maxBundle = max(maxBundle, len(certs))
			}
			mu.Unlock()
		}
	}()

	var addrs []string
	for i := range 3 {
		a, err := authority.New(authority.Config{
			Name: "e2e-authority-" + string(rune('a'+i)), Namespace: ns, SecretName: "webhook-ca", Client: client,
			Hosts:    []string{"webhook.test"},
			Lifetime: 4 * time.Second, RenewBefore: 2 * time.Second,
			CALifetime: 12 * time.Second, CARenewBefore: 6 * time.Second, PropagationDelay: 2 * time.Second,
		})
		require.NoError(t, err)
		addrs = append(addrs, serve(t, a))
	}

	deadline := time.Now().Add(30 * time.Second)
	var handshakes, failures int
	for time.Now().Before(deadline) {
		s, err := admin.CoreV1().Secrets(ns).Get(ctx, "webhook-ca", metav1.GetOptions{})
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		pool := tlstest.Pool(t, s.Data["ca.crt"])
		for _, addr := range addrs {
			handshakes++
			if _, err := tlstest.Handshake(addr, &tls.Config{ServerName: "webhook.test", RootCAs: pool}); err != nil {
				failures++
				t.Errorf("handshake with %s: %v", addr, err)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("authority: %d handshakes, %d failures, %d signing CAs, %d secret writes, max bundle %d", handshakes, failures, len(signing), writes.Load(), maxBundle)
	assert.Zero(t, failures)
	assert.GreaterOrEqual(t, len(signing), 3, "several CA rotations")
	assert.GreaterOrEqual(t, maxBundle, 2, "bundle overlap observed")
	// Each CA costs at most three writes (publish, promote, prune); a
	// ping-pong between replicas would be far more.
	assert.LessOrEqual(t, writes.Load(), int64(3*len(signing)+3))
}
