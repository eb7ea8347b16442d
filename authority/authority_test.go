package authority

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/tlstest"
)

func countWrites(client *fake.Clientset) *atomic.Int64 {
	n := &atomic.Int64{}
	for _, verb := range []string{"create", "update"} {
		client.PrependReactor(verb, "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
			n.Add(1)
			return false, nil, nil
		})
	}
	return n
}

func newTestAuthority(t testing.TB, client *fake.Clientset, clk *clocktesting.FakeClock, name string) *Authority {
	t.Helper()
	a, err := New(Config{
		Name: name, Namespace: "ns", SecretName: "ca", Client: client,
		Hosts: []string{"webhook.ns.svc", "127.0.0.1"}, Lifetime: time.Hour, Clock: clk,
		// These tests are about the Secret; replica Leases have their own.
		DisableReplicaAnnouncements: true,
	})
	require.NoError(t, err)
	return a
}

func TestAuthorityCreatesSecret(t *testing.T) {
	client := fake.NewClientset()
	writes := countWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	a := newTestAuthority(t, client, clk, "authority-create")
	cert, _ := a.CurrentCertKeyContent()
	assert.Nil(t, cert, "no content before the first reconcile")

	require.NoError(t, a.RunOnce(context.Background()))
	secret, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.SecretTypeTLS, secret.Type)
	assert.Equal(t, secret.Data["ca.crt"], secret.Data["tls.crt"], "one CA: the bundle is the signing CA")
	assert.Equal(t, secret.Data["ca.crt"], a.CurrentCABundleContent())
	assert.EqualValues(t, 1, writes.Load())

	leaf := a.Leaf()
	_, err = leaf.Verify(x509.VerifyOptions{Roots: tlstest.Pool(t, a.CurrentCABundleContent()), DNSName: "webhook.ns.svc", CurrentTime: clk.Now()})
	require.NoError(t, err)
	assert.NotContains(t, string(secret.Data["tls.key"]), string(mustKeyPEM(a)), "leaf keys stay in memory")

	require.NoError(t, a.RunOnce(context.Background()))
	assert.EqualValues(t, 1, writes.Load(), "nothing due: no write")
}

func mustKeyPEM(a *Authority) []byte {
	_, key := a.CurrentCertKeyContent()
	return key
}

func TestAuthorityDisableCreateWaits(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a, err := New(Config{
		Namespace: "ns", SecretName: "ca", Client: client, DisableCreate: true,
		Hosts: []string{"webhook.ns.svc"}, Lifetime: time.Hour, Clock: clk,
	})
	require.NoError(t, err)
	require.NoError(t, a.RunOnce(context.Background()), "waiting for a pre-created secret is not an error")
	assert.Nil(t, a.Leaf())

	// An operator creates the Secret (here: another authority that may create).
	creator := newTestAuthority(t, client, clk, "authority-creator")
	require.NoError(t, creator.RunOnce(context.Background()))
	require.NoError(t, a.RunOnce(context.Background()))
	require.NotNil(t, a.Leaf())
	assert.Equal(t, creator.CurrentCABundleContent(), a.CurrentCABundleContent())
}

func TestAuthorityRejectsBadSecret(t *testing.T) {
	pair := issueTestPair(t, "not-a-ca", testNow, time.Hour)
	client := fake.NewClientset(tlsSecret("ca", map[string][]byte{"tls.crt": pair.CertPEM, "tls.key": pair.KeyPEM}))
	writes := countWrites(client)
	a := newTestAuthority(t, client, clocktesting.NewFakeClock(testNow), "authority-bad")
	err := a.RunOnce(context.Background())
	require.ErrorContains(t, err, "CA secret ns/ca: signing CA (tls.crt, tls.key): certificate is not a CA")
	assert.Zero(t, writes.Load(), "someone else's content is never overwritten")
}

// TestAuthorityReplicasRotate runs three replicas sharing one Secret through
// 5 CA lifetimes (30 under -authority.long) on a fake clock. At every step each replica's leaf must
// verify against the bundle a client fetched one step earlier, the Secret
// holds one signing CA, and writes happen only on real transitions.
func TestAuthorityReplicasRotate(t *testing.T) {
	const lifetime = time.Hour
	client := fake.NewClientset()
	writes := countWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	replicas := []*Authority{
		newTestAuthority(t, client, clk, "authority-r0"),
		newTestAuthority(t, client, clk, "authority-r1"),
		newTestAuthority(t, client, clk, "authority-r2"),
	}
	addrs := make([]string, len(replicas))
	for i, r := range replicas {
		require.NoError(t, r.RunOnce(context.Background()))
		addrs[i] = tlstest.Server(t, servingConfig(r))
	}
	previous := replicas[0].CurrentCABundleContent()
	signing := map[string]bool{}
	overlap := 0
	// CALifetime is 8 lifetimes; 10 steps per lifetime. 5 CA lifetimes in
	// make test (the simulator covers rotations at large), 30 in make soak.
	caLifetimes := scenarioSize(5, 30)
	steps := caLifetimes * 8 * 10
	for step := range steps {
		clk.Step(lifetime / 10)
		for i, r := range replicas {
			require.NoError(t, r.RunOnce(context.Background()))
			_, err := tlstest.Handshake(addrs[i], &tls.Config{ServerName: "webhook.ns.svc", RootCAs: tlstest.Pool(t, previous), Time: clk.Now})
			require.NoError(t, err, "step %d replica %d", step, i)
		}
		secret, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
		require.NoError(t, err)
		signing[string(secret.Data["tls.crt"])] = true
		if len(mustParseBundle(t, secret.Data["ca.crt"])) > 1 {
			overlap++
		}
		previous = replicas[0].CurrentCABundleContent()
	}
	// One CA per 2/3 of a CA lifetime; each CA transition is two writes
	// (publish, then promote) plus pruning of the expired CA.
	cas := len(signing)
	assert.GreaterOrEqual(t, cas, caLifetimes*4/3-1)
	assert.LessOrEqual(t, writes.Load(), int64(3*cas+1), "no write ping-pong between replicas")
	assert.Positive(t, overlap, "bundle overlap observed")
}
