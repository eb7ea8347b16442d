package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
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
	watches := secretWatches(client) // installed before Run
	clk := clocktesting.NewFakeClock(testNow)
	obs := &testObserver{} // holds the successor back
	a := runAdopting(t, client, clk, "adopt-cm-del", LayoutCertManager, func(c *Config) { c.Observers = []Observer{obs} })
	waitFor(t, "a leaf", func() bool { return a.Leaf() != nil })
	waitWaiters(t, clk, 1)
	published := getSecret(t, client).Data[NextCertKey]
	require.NotEmpty(t, published, "the successor is published at once")

	// The fake API server, unlike a real one, cannot resume a watch from
	// the list's resourceVersion: a delete between the informer's list and
	// its watch would never be delivered.
	waitFor(t, "the Secret watch", func() bool { return watches.Load() > 0 })
	require.NoError(t, client.CoreV1().Secrets("ns").Delete(context.Background(), "ca", metav1.DeleteOptions{}))
	waitFor(t, "the Secret written back", func() bool {
		s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
		return err == nil && len(s.Data[NextCertKey]) > 0
	})
	waitWaiters(t, clk, 1)
	s := getSecret(t, client)
	assert.Equal(t, string(f.ca.CertPEM), string(s.Data["tls.crt"]), "the adopted CA still signs")
	assert.Equal(t, string(published), string(s.Data[NextCertKey]), "the successor published is written back, not replaced by another")
	assert.Len(t, mustParseBundle(t, s.Data["ca.crt"]), 2, "ca.crt: the adopted CA and its one successor")
}

// TestAdoptKnativeSecretDeletedMidAdoption: while the replica still
// serves knative's leaf (its successor published, not yet observed), the
// Secret is deleted. The replica writes back what it had in force, in a
// layout that it, a restarted replica and a real API server accept:
// knative's CA and leaf (a keyless CA cannot be written as tls.crt/tls.key,
// and a kubernetes.io/tls Secret without them is invalid), once, without a
// write loop; and a fresh replica adopting the rewritten Secret serves
// knative's leaf, which the caBundle of today verifies, instead of taking
// the successor as an unobserved signing CA.
func TestAdoptKnativeSecretDeletedMidAdoption(t *testing.T) {
	f := newForeignCA(t, "knative-ca")
	client := fake.NewClientset(opaqueSecret(f.knative()))
	optimistic(client)
	writes := secretWrites(client)
	watches := secretWatches(client) // installed before Run
	clk := clocktesting.NewFakeClock(testNow)
	obs := &testObserver{} // holds the successor back
	withObs := func(c *Config) { c.Observers = []Observer{obs} }
	a := runAdopting(t, client, clk, "adopt-kn-del-a", LayoutKnative, withObs)
	waitFor(t, "knative's leaf served", func() bool { return a.Leaf() != nil })
	waitWaiters(t, clk, 1)
	published := getSecret(t, client).Data[NextCertKey]
	require.NotEmpty(t, published, "the successor is published")

	// The count starts before the delete: the write-back may come before
	// the next line runs (it did under load, and the loop below then
	// waited forever for a write that had already happened).
	// The fake API server, unlike a real one, cannot resume a watch from
	// the list's resourceVersion: a delete between the informer's list and
	// its watch would never be delivered.
	waitFor(t, "the Secret watch", func() bool { return watches.Load() > 0 })
	start := writes.Load()
	require.NoError(t, client.CoreV1().Secrets("ns").Delete(context.Background(), "ca", metav1.DeleteOptions{}))
	// Settled: the loop asleep, the Secret written back and not written
	// since. A write loop never settles; it fails on the write count.
	deadline := time.Now().Add(time.Minute)
	for settled := false; !settled; {
		require.False(t, time.Now().After(deadline), "the Secret was not written back within a minute of its deletion")
		n := writes.Load() - start
		require.LessOrEqual(t, n, int64(3), "write loop: the Secret is written back on every watch event")
		rv := secretRV(client)
		settled = n > 0 && rv != "" && clk.Waiters() >= 1 && rv == secretRV(client) && writes.Load()-start == n
		time.Sleep(time.Millisecond)
	}
	s := getSecret(t, client)
	assert.NotEqual(t, corev1.SecretTypeTLS, s.Type, "a kubernetes.io/tls Secret must hold tls.crt and tls.key; a keyless CA has none")
	assert.Equal(t, string(f.ca.CertPEM), string(s.Data["ca-cert.pem"]), "knative's CA is written back")
	assert.Equal(t, string(f.leaf.CertPEM), string(s.Data["server-cert.pem"]), "knative's leaf is written back")
	assert.Equal(t, string(f.leaf.KeyPEM), string(s.Data["server-key.pem"]))
	assert.Equal(t, string(published), string(s.Data[NextCertKey]), "the successor published (and maybe already observed) is written back, not replaced by another")
	assert.True(t, a.Leaf().Equal(f.leaf.Cert), "the replica keeps serving knative's leaf")

	// A replica started now (a restart, a scale-up) adopts what is there.
	b := runAdopting(t, client, clk, "adopt-kn-del-b", LayoutKnative, withObs)
	waitFor(t, "b's first check", func() bool { return b.Leaf() != nil || b.LastError() != nil })
	require.NoError(t, b.LastError())
	require.NoError(t, handshakeWith(t, b, f.ca.CertPEM, clk.Now), "a client holding knative's caBundle verifies the restarted replica")
	assert.Zero(t, b.Status().UnsafeRotations)
}

// TestAdoptKnativeRollbackToExpiredCA: while the replica serves knative's
// leaf, the Secret is restored from an old backup whose CA (with its key)
// is older than knative's and has expired. That is a rollback, as it is
// for a CA of the Authority's own: the replica writes back knative's CA
// and leaf and its successor, and keeps serving knative's leaf. Taking
// the backup's CA as the one in force would make the successor sign at
// once, before it was observed: an unsafe rotation and a leaf that
// clients holding today's caBundle reject.
func TestAdoptKnativeRollbackToExpiredCA(t *testing.T) {
	f := newForeignCA(t, "knative-ca")
	old, err := pki.NewCA(pki.Request{CommonName: "backup-ca", KeyType: pki.ECDSAP256, Now: testNow.Add(-48 * time.Hour), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	client := fake.NewClientset(opaqueSecret(f.knative()))
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	obs := &testObserver{} // holds the successor back
	a := runAdopting(t, client, clk, "adopt-kn-rollback", LayoutKnative, func(c *Config) { c.Observers = []Observer{obs} })
	waitFor(t, "knative's leaf served", func() bool { return a.Leaf() != nil })
	waitWaiters(t, clk, 1)
	published := getSecret(t, client).Data[NextCertKey]
	require.NotEmpty(t, published)

	backup := getSecret(t, client)
	backup.Data = map[string][]byte{"tls.crt": old.CertPEM, "tls.key": old.KeyPEM, "ca.crt": old.CertPEM}
	backup.Annotations = nil
	restored, err := client.CoreV1().Secrets("ns").Update(context.Background(), backup, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor(t, "the rollback handled", func() bool {
		return secretRV(client) != restored.ResourceVersion && clk.Waiters() >= 1 && a.LastError() == nil
	})
	assert.Zero(t, a.Status().UnsafeRotations, "no CA signs unobserved")
	assert.True(t, a.Leaf().Equal(f.leaf.Cert), "the replica keeps serving knative's leaf")
	require.NoError(t, handshakeWith(t, a, f.ca.CertPEM, clk.Now), "a client holding knative's caBundle verifies the replica")
	s := getSecret(t, client)
	assert.Empty(t, s.Data["tls.crt"], "the backup's CA is not the one in force")
	assert.Equal(t, string(f.ca.CertPEM), string(s.Data["ca-cert.pem"]))
	assert.Equal(t, string(published), string(s.Data[NextCertKey]))
}

// TestAdoptKnativeLeafExpiresBeforeSuccessorObserved: knative's CA has no
// key here, so knative's leaf is all it can serve. When that leaf expires
// while the successor still waits for its observers, no CA that could
// serve is left: as when the signing CA itself ends, the successor signs
// unobserved, counted as an unsafe rotation, rather than every replica
// serving an expired leaf until knative's CA ends too.
func TestAdoptKnativeLeafExpiresBeforeSuccessorObserved(t *testing.T) {
	const notBackdated = time.Nanosecond
	made := testNow.Add(-time.Minute)
	ca, err := pki.NewCA(pki.Request{CommonName: "knative-ca", KeyType: pki.ECDSAP256, Now: made, Backdate: notBackdated, Lifetime: 2 * time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "localhost", DNSNames: []string{"localhost"}, KeyType: pki.ECDSAP256, Now: made, Backdate: notBackdated, Lifetime: 20 * time.Minute})
	require.NoError(t, err)
	f := foreignCA{ca: ca, leaf: leaf}
	client := fake.NewClientset(opaqueSecret(f.knative()))
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	obs := &testObserver{} // never confirms the successor
	a := runAdopting(t, client, clk, "adopt-kn-leaf-ends", LayoutKnative, func(c *Config) { c.Observers = []Observer{obs} })
	waitFor(t, "knative's leaf served", func() bool { return a.Leaf() != nil })
	waitWaiters(t, clk, 1)
	published := a.CurrentCABundleContent()

	for clk.Now().Before(leaf.Cert.NotAfter.Add(2 * time.Minute)) {
		clk.Step(time.Minute)
		waitWaiters(t, clk, 1)
		waitFor(t, "a check", func() bool { return a.LastError() == nil })
	}
	require.NoError(t, handshakeWith(t, a, published, clk.Now), "the replica serves a leaf that a client holding the published bundle verifies, not knative's expired one")
	assert.EqualValues(t, 1, a.Status().UnsafeRotations, "the successor signed unobserved: counted")
}
