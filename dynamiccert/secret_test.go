package dynamiccert

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
)

var testNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func issueTestPair(t testing.TB, cn string, now time.Time, lifetime time.Duration) *pki.Issued {
	t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: cn + "-ca", Now: now, Lifetime: 10 * lifetime})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: cn, DNSNames: []string{cn}, Now: now, Lifetime: lifetime})
	require.NoError(t, err)
	return leaf
}

func tlsSecret(name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Type:       corev1.SecretTypeTLS,
		Data:       data,
	}
}

func TestSecretCertKeyConfigErrors(t *testing.T) {
	_, err := NewSecretCertKey(SecretConfig{SecretName: "x", Client: fake.NewClientset()})
	require.Error(t, err)
	_, err = NewSecretCertKey(SecretConfig{Namespace: "ns", SecretName: "x"})
	require.ErrorContains(t, err, "ns/x")
}

func TestSecretCertKeyRunOnceBadInput(t *testing.T) {
	good := issueTestPair(t, "good.test", testNow, time.Hour)
	other := issueTestPair(t, "other.test", testNow, time.Hour)
	expired := issueTestPair(t, "expired.test", testNow.Add(-2*time.Hour), time.Hour)
	future := issueTestPair(t, "future.test", testNow.Add(2*time.Hour), time.Hour)
	for name, tc := range map[string]struct {
		data map[string][]byte
		want string
	}{
		"missing key":     {map[string][]byte{"tls.crt": good.CertPEM}, "missing or empty keys [tls.key]"},
		"missing both":    {nil, "missing or empty keys [tls.crt tls.key]"},
		"malformed":       {map[string][]byte{"tls.crt": []byte("not pem"), "tls.key": good.KeyPEM}, "malformed PEM"},
		"trailing junk":   {map[string][]byte{"tls.crt": append(append([]byte{}, good.CertPEM...), "junk"...), "tls.key": good.KeyPEM}, "trailing data"},
		"mismatched key":  {map[string][]byte{"tls.crt": good.CertPEM, "tls.key": other.KeyPEM}, "does not match"},
		"expired":         {map[string][]byte{"tls.crt": expired.CertPEM, "tls.key": expired.KeyPEM}, "expired"},
		"not yet valid":   {map[string][]byte{"tls.crt": future.CertPEM, "tls.key": future.KeyPEM}, "not yet valid"},
		"secret is a CA?": {map[string][]byte{"tls.crt": []byte{}, "tls.key": good.KeyPEM}, "missing or empty keys [tls.crt]"},
	} {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset(tlsSecret("s", map[string][]byte{"tls.crt": good.CertPEM, "tls.key": good.KeyPEM}))
			p, err := NewSecretCertKey(SecretConfig{Name: "secret-" + name, Namespace: "ns", SecretName: "s", Client: client, Clock: clocktesting.NewFakeClock(testNow)})
			require.NoError(t, err)
			require.NoError(t, p.RunOnce(context.Background()))
			_, err = client.CoreV1().Secrets("ns").Update(context.Background(), tlsSecret("s", tc.data), metav1.UpdateOptions{})
			require.NoError(t, err)

			before := certmetricstest.LoadErrors(t, p.Name())
			err = p.RunOnce(context.Background())
			require.Error(t, err)
			assert.ErrorContains(t, err, "ns/s")
			assert.ErrorContains(t, err, tc.want)
			assert.Equal(t, before+1, certmetricstest.LoadErrors(t, p.Name()))
			cert, _ := p.CurrentCertKeyContent()
			assert.Equal(t, good.CertPEM, cert, "the last good certificate keeps being served")
			assert.Equal(t, err, p.LastError())
		})
	}
}

func TestSecretCertKeyAPIErrors(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("get", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "s", nil)
	})
	p, err := NewSecretCertKey(SecretConfig{Namespace: "ns", SecretName: "s", Client: client})
	require.NoError(t, err)
	err = p.RunOnce(context.Background())
	require.ErrorContains(t, err, "reading secret ns/s: forbidden (RBAC must allow get, list and watch")

	p, err = NewSecretCertKey(SecretConfig{Namespace: "ns", SecretName: "absent", Client: fake.NewClientset()})
	require.NoError(t, err)
	require.ErrorContains(t, p.RunOnce(context.Background()), "reading secret ns/absent: not found")
}

// TestSecretCertKeyWatch follows a Secret through update, bad content,
// deletion and re-creation with the informer, as Run does.
func TestSecretCertKeyWatch(t *testing.T) {
	first := issueTestPair(t, "a.test", time.Now(), time.Hour)
	second := issueTestPair(t, "a.test", time.Now(), time.Hour)
	third := issueTestPair(t, "a.test", time.Now(), time.Hour)
	client := fake.NewClientset(tlsSecret("s", map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM}))
	p, err := NewSecretCertKey(SecretConfig{Name: "secret-watch", Namespace: "ns", SecretName: "s", Client: client})
	require.NoError(t, err)
	changes := &countingListener{}
	p.AddListener(changes)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx, 1) }()
	defer func() { cancel(); <-done }()

	serving := func(want *pki.Issued) func() bool {
		return func() bool {
			cert, key := p.CurrentCertKeyContent()
			return string(cert) == string(want.CertPEM) && string(key) == string(want.KeyPEM)
		}
	}
	secrets := client.CoreV1().Secrets("ns")
	require.Eventually(t, serving(first), 5*time.Second, time.Millisecond)

	_, err = secrets.Update(ctx, tlsSecret("s", map[string][]byte{"tls.crt": second.CertPEM, "tls.key": second.KeyPEM}), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, serving(second), 5*time.Second, time.Millisecond)

	_, err = secrets.Update(ctx, tlsSecret("s", map[string][]byte{"tls.crt": third.CertPEM, "tls.key": second.KeyPEM}), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.LastError() != nil }, 5*time.Second, time.Millisecond)
	assert.True(t, serving(second)(), "half-written pair rejected")

	require.NoError(t, secrets.Delete(ctx, "s", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		err := p.LastError()
		return err != nil && err.Error() == "secret ns/s was deleted"
	}, 5*time.Second, time.Millisecond)
	assert.True(t, serving(second)(), "deleted secret: last good kept")

	_, err = secrets.Create(ctx, tlsSecret("s", map[string][]byte{"tls.crt": third.CertPEM, "tls.key": third.KeyPEM}), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, serving(third), 5*time.Second, time.Millisecond)
	assert.NoError(t, p.LastError())
	// Listeners are notified right after the content is stored.
	require.Eventually(t, func() bool { return changes.n.Load() >= 3 }, 5*time.Second, time.Millisecond, "three notifications")
}

func TestSecretCA(t *testing.T) {
	a := issueTestPair(t, "a.test", testNow, time.Hour)
	ca, err := pki.NewCA(pki.Request{CommonName: "ca", Now: testNow, Lifetime: time.Hour})
	require.NoError(t, err)
	client := fake.NewClientset(tlsSecret("ca", map[string][]byte{"ca.crt": ca.CertPEM}))
	p, err := NewSecretCA(SecretConfig{Namespace: "ns", SecretName: "ca", Client: client})
	require.NoError(t, err)
	_, ok := p.VerifyOptions()
	assert.False(t, ok, "no options before the first load")
	require.NoError(t, p.RunOnce(context.Background()))
	assert.Equal(t, ca.CertPEM, p.CurrentCABundleContent())
	_, ok = p.VerifyOptions()
	assert.True(t, ok)

	_, err = client.CoreV1().Secrets("ns").Update(context.Background(), tlsSecret("ca", map[string][]byte{"ca.crt": a.KeyPEM}), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.ErrorContains(t, p.RunOnce(context.Background()), "secret ns/ca key ca.crt: CA bundle: malformed PEM")
	assert.Equal(t, ca.CertPEM, p.CurrentCABundleContent())
}

// TestSecretCertKeyUnreachable starts with an API server that does not
// answer: RunOnce fails naming the Secret, and the error is counted.
func TestSecretCertKeyUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there any more
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + addr, Timeout: 2 * time.Second})
	require.NoError(t, err)
	p, err := NewSecretCertKey(SecretConfig{Name: "secret-unreachable", Namespace: "ns", SecretName: "s", Client: client})
	require.NoError(t, err)
	before := certmetricstest.LoadErrors(t, p.Name())
	err = p.RunOnce(context.Background())
	require.ErrorContains(t, err, "reading secret ns/s")
	assert.ErrorContains(t, err, "connection refused")
	assert.Equal(t, before+1, certmetricstest.LoadErrors(t, p.Name()))
	cert, _ := p.CurrentCertKeyContent()
	assert.Nil(t, cert)
}
