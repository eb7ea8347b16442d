package authority

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
)

// foreignCA is another rotator's CA and the serving leaf it signed: made a
// minute before testNow and not backdated (cert-manager and knative set
// NotBefore to the time of issue), ending in two hours, so that the
// adopting Authority publishes its successor at once, and that successor,
// backdated by the skew tolerance, has an earlier NotBefore than the CA
// it replaces.
type foreignCA struct {
	ca, leaf *pki.Issued
}

func newForeignCA(t *testing.T, name string) foreignCA {
	t.Helper()
	const notBackdated = time.Nanosecond
	made := testNow.Add(-time.Minute)
	ca, err := pki.NewCA(pki.Request{CommonName: name, KeyType: pki.ECDSAP256, Now: made, Backdate: notBackdated, Lifetime: 2 * time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "localhost", DNSNames: []string{"localhost"}, KeyType: pki.ECDSAP256, Now: made, Backdate: notBackdated, Lifetime: 2 * time.Hour})
	require.NoError(t, err)
	return foreignCA{ca: ca, leaf: leaf}
}

func (f foreignCA) certController() map[string][]byte {
	return map[string][]byte{"ca.crt": f.ca.CertPEM, "ca.key": f.ca.KeyPEM, "tls.crt": f.leaf.CertPEM, "tls.key": f.leaf.KeyPEM}
}

func (f foreignCA) certManager() map[string][]byte {
	return map[string][]byte{"tls.crt": f.ca.CertPEM, "tls.key": f.ca.KeyPEM, "ca.crt": f.ca.CertPEM}
}

func (f foreignCA) knative() map[string][]byte {
	return map[string][]byte{"ca-cert.pem": f.ca.CertPEM, "server-cert.pem": f.leaf.CertPEM, "server-key.pem": f.leaf.KeyPEM}
}

// opaqueSecret is the Secret as the other tools write it: type Opaque.
func opaqueSecret(data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca", ResourceVersion: "written-by-the-other-tool"}, Data: data}
}

func getSecret(t *testing.T, client *fake.Clientset) *corev1.Secret {
	t.Helper()
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	return s
}

// runAdopting starts an Authority adopting layout in its Run loop, stopped
// at the end of the test.
func runAdopting(t *testing.T, client *fake.Clientset, clk *clocktesting.FakeClock, name string, layout SecretLayout, mutate func(*Config)) *Authority {
	t.Helper()
	a := attackAuthority(t, client, clk, name, func(c *Config) {
		c.Adopt = layout
		if mutate != nil {
			mutate(c)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

// rotateOnce steps the clock a minute at a time until every replica signs
// with a CA other than old, checking at every step, through real TLS
// handshakes, that each replica's leaf verifies against trusted (what
// clients hold) and that the rotation was never unsafe.
func rotateOnce(t *testing.T, clk *clocktesting.FakeClock, old *pki.Issued, trusted func() []byte, replicas ...*Authority) {
	t.Helper()
	signs := func(a *Authority) bool {
		a.mu.RLock()
		defer a.mu.RUnlock()
		return a.leaf != nil && !a.cas.signing.Cert.Equal(old.Cert) && a.cas.signing.Key != nil && a.leaf.Cert.CheckSignatureFrom(a.cas.signing.Cert) == nil
	}
	for steps := 0; ; steps++ {
		require.Less(t, steps, 5*60, "no observed rotation within five hours")
		done := true
		for _, r := range replicas {
			require.NoError(t, handshakeWith(t, r, trusted(), clk.Now), "%s at %s", r.Name(), clk.Now())
			require.Zero(t, r.Status().UnsafeRotations, r.Name())
			done = done && signs(r)
		}
		if done {
			return
		}
		clk.Step(time.Minute)
		waitWaiters(t, clk, len(replicas))
		for _, r := range replicas {
			waitFor(t, r.Name()+" to take the Secret in", func() bool { return r.LastError() == nil && r.Leaf() != nil })
		}
	}
}

// TestAdoptCertControllerSecret: two replicas adopt the Secret OPA
// cert-controller wrote. Its CA keeps signing (each replica's leaf chains
// to the caBundle the webhooks hold today), the Secret is rewritten in the
// Authority's layout with the resourceVersion read, and the first CA
// rotation after it is observed: a client holding the caBundle of the
// adoption verifies every replica until the successor has been published
// to it.
func TestAdoptCertControllerSecret(t *testing.T) {
	f := newForeignCA(t, "cert-controller-ca")
	client := fake.NewClientset(opaqueSecret(f.certController()))
	optimistic(client)
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	a := runAdopting(t, client, clk, "adopt-cc-a", LayoutCertController, func(c *Config) { c.DisableReplicaAnnouncements = false })
	b := runAdopting(t, client, clk, "adopt-cc-b", LayoutCertController, func(c *Config) { c.DisableReplicaAnnouncements = false })
	waitFor(t, "both replicas' leaves", func() bool { return a.Leaf() != nil && b.Leaf() != nil })
	waitWaiters(t, clk, 2)

	s := getSecret(t, client)
	assert.Equal(t, string(f.ca.CertPEM), string(s.Data["tls.crt"]), "cert-controller's CA signs")
	assert.Equal(t, string(f.ca.KeyPEM), string(s.Data["tls.key"]))
	assert.Contains(t, string(s.Data["ca.crt"]), string(pki.EncodeCertPEM(f.ca.Cert.Raw)), "the CA clients trust stays in ca.crt")
	assert.NotContains(t, s.Data, "ca.key", "the adopted Secret is in the Authority's layout")
	assert.LessOrEqual(t, writes.Load(), int64(2), "the conversion with the successor's publication, written by one replica (the other's attempt is a conflict)")
	for _, r := range []*Authority{a, b} {
		require.NoError(t, r.Leaf().CheckSignatureFrom(f.ca.Cert), "%s signs with the adopted CA", r.Name())
		require.NoError(t, handshakeWith(t, r, f.ca.CertPEM, clk.Now), "a client holding cert-controller's caBundle verifies %s", r.Name())
	}

	// The first rotation: clients refresh their caBundle from the replicas
	// (as cabundle.Publisher would) once a successor is published; until
	// then they hold cert-controller's CA alone.
	rotateOnce(t, clk, f.ca, a.CurrentCABundleContent, a, b)
	s = getSecret(t, client)
	assert.Contains(t, string(s.Data["ca.crt"]), string(pki.EncodeCertPEM(f.ca.Cert.Raw)), "the old CA stays trusted until it expires")
	assert.NoError(t, a.LastError())
	noAnnouncementRejected(t, a, b)
}

// TestAdoptCertManagerSecret: cert-manager's DynamicAuthority layout is
// the Authority's own. Adopting it keeps its CA signing without a write,
// and the first rotation after it is observed.
func TestAdoptCertManagerSecret(t *testing.T) {
	f := newForeignCA(t, "cert-manager-webhook-ca")
	sec := opaqueSecret(f.certManager())
	sec.Annotations = map[string]string{"cert-manager.io/allow-direct-injection": "true"}
	client := fake.NewClientset(sec)
	optimistic(client)
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	// The replicas announce and wait for each other, as in a Deployment,
	// and the delay is short, as in a migration test: the successor's
	// leaves (backdated by the skew tolerance) have an earlier NotBefore
	// than the adopted CA's leaves, which cannot start before that CA,
	// made a minute ago and not backdated.
	announce := func(c *Config) { c.DisableReplicaAnnouncements, c.PropagationDelay = false, 10*time.Second }
	a := runAdopting(t, client, clk, "adopt-cm-a", LayoutCertManager, announce)
	b := runAdopting(t, client, clk, "adopt-cm-b", LayoutCertManager, announce)
	waitFor(t, "both replicas' leaves", func() bool { return a.Leaf() != nil && b.Leaf() != nil })
	waitWaiters(t, clk, 2)
	assert.LessOrEqual(t, writes.Load(), int64(2), "cert-manager's layout is the Authority's: nothing to convert, only the successor's publication (by one replica; the other's attempt is a conflict)")
	for _, r := range []*Authority{a, b} {
		require.NoError(t, r.Leaf().CheckSignatureFrom(f.ca.Cert), "%s signs with the adopted CA", r.Name())
		require.NoError(t, handshakeWith(t, r, f.ca.CertPEM, clk.Now), "a client holding cert-manager's ca.crt verifies %s", r.Name())
	}
	rotateOnce(t, clk, f.ca, a.CurrentCABundleContent, a, b)
	s := getSecret(t, client)
	assert.Contains(t, string(s.Data["ca.crt"]), string(pki.EncodeCertPEM(f.ca.Cert.Raw)), "the old CA stays trusted until it expires")
	assert.Equal(t, "true", s.Annotations["cert-manager.io/allow-direct-injection"], "annotations are kept")
	noAnnouncementRejected(t, a, b)
}

// TestAdoptKnativeSecret: knative does not store its CA's key. The
// replicas serve knative's leaf, publish a successor beside knative's CA
// at once, and switch to leaves of their own only once the successor is
// observed: here an Observer (standing in for the caBundle publisher)
// that holds it back past the minimum delay. knative's keys then leave the
// Secret; knative's CA stays in ca.crt.
func TestAdoptKnativeSecret(t *testing.T) {
	f := newForeignCA(t, "knative-ca")
	client := fake.NewClientset(opaqueSecret(f.knative()))
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	obs := &testObserver{}
	// The replicas announce and wait for each other, as in a Deployment,
	// and the delay is short, as in a migration test: the successor's
	// leaves (backdated by the skew tolerance) have an earlier NotBefore
	// than knative's leaf, made a minute ago and not backdated.
	withObs := func(c *Config) {
		c.Observers, c.DisableReplicaAnnouncements, c.PropagationDelay = []Observer{obs}, false, 10*time.Second
	}
	a := runAdopting(t, client, clk, "adopt-kn-a", LayoutKnative, withObs)
	b := runAdopting(t, client, clk, "adopt-kn-b", LayoutKnative, withObs)
	waitFor(t, "both replicas' leaves", func() bool { return a.Leaf() != nil && b.Leaf() != nil })
	waitWaiters(t, clk, 2)

	for _, r := range []*Authority{a, b} {
		assert.True(t, r.Leaf().Equal(f.leaf.Cert), "%s serves knative's leaf", r.Name())
		require.NoError(t, handshakeWith(t, r, f.ca.CertPEM, clk.Now), "a client holding knative's caBundle verifies %s", r.Name())
		_, err := r.SignLeaf(LeafRequest{PublicKey: f.leaf.Key.Public(), Lifetime: time.Hour})
		assert.ErrorIs(t, err, ErrNoSigningCA, "a CA without its key signs nothing")
	}
	s := getSecret(t, client)
	assert.Empty(t, s.Data["tls.crt"], "no CA with a key signs yet")
	require.NotEmpty(t, s.Data[NextCertKey], "a successor is published at once")
	bundle := mustParseBundle(t, s.Data["ca.crt"])
	require.Len(t, bundle, 2)
	assert.True(t, bundle[0].Equal(f.ca.Cert), "knative's CA stays in ca.crt")
	assert.Equal(t, string(f.leaf.CertPEM), string(s.Data["server-cert.pem"]), "knative's leaf is kept while it is served")
	published := a.CurrentCABundleContent()

	// Past the minimum delay, the observer still holds the successor back.
	clk.Step(a.cfg.PropagationDelay + time.Minute)
	waitWaiters(t, clk, 2)
	for _, r := range []*Authority{a, b} {
		waitFor(t, "a check", func() bool { return r.LastError() == nil })
		assert.True(t, r.Leaf().Equal(f.leaf.Cert), "%s keeps knative's leaf until the successor is observed", r.Name())
	}
	obs.set(true)
	rotateOnce(t, clk, f.ca, func() []byte { return published }, a, b)
	s = getSecret(t, client)
	assert.NotEmpty(t, s.Data["tls.crt"])
	for _, k := range []string{"ca-cert.pem", "server-cert.pem", "server-key.pem"} {
		assert.NotContains(t, s.Data, k, "knative's keys leave once a CA of ours signs")
	}
	assert.Contains(t, string(s.Data["ca.crt"]), string(pki.EncodeCertPEM(f.ca.Cert.Raw)), "knative's CA stays trusted until it expires")
	noAnnouncementRejected(t, a, b)
}

// noAnnouncementRejected checks that the replicas believed each other
// throughout: a genuine announcement that is rejected is not waited for.
func noAnnouncementRejected(t *testing.T, replicas ...*Authority) {
	t.Helper()
	for _, r := range replicas {
		for _, reason := range []string{certmetrics.AnnouncementForged, certmetrics.AnnouncementReplayed, certmetrics.AnnouncementGarbled} {
			assert.Zero(t, rejected(t, r, reason), "%s rejected a genuine replica announcement as %s", r.Name(), reason)
		}
	}
}

// TestAdoptRejectsBadSecret: a Secret of the declared layout with a
// missing key, a CA key that does not match, or a leaf the CA did not
// sign fails with an error naming the Secret and the key, counted as a
// load error, and nothing is written or served.
func TestAdoptRejectsBadSecret(t *testing.T) {
	f := newForeignCA(t, "good-ca")
	other := newForeignCA(t, "other-ca")
	without := func(m map[string][]byte, k string) map[string][]byte { delete(m, k); return m }
	with := func(m map[string][]byte, k string, v []byte) map[string][]byte { m[k] = v; return m }
	n := 0
	for _, tc := range []struct {
		name   string
		layout SecretLayout
		data   map[string][]byte
		want   string
	}{
		{"cert-controller/missing ca.key", LayoutCertController, without(f.certController(), "ca.key"), "cert-controller layout: key ca.key is missing"},
		{"cert-controller/missing tls.key", LayoutCertController, without(f.certController(), "tls.key"), "cert-controller layout: key tls.key is missing"},
		{"cert-controller/ca.key mismatch", LayoutCertController, with(f.certController(), "ca.key", other.ca.KeyPEM), "CA (ca.crt, ca.key): private key does not match"},
		{"cert-controller/leaf of another CA", LayoutCertController, with(with(f.certController(), "tls.crt", other.leaf.CertPEM), "tls.key", other.leaf.KeyPEM), "serving certificate tls.crt is not signed by the CA \"good-ca\""},
		{"cert-manager/missing tls.key", LayoutCertManager, without(f.certManager(), "tls.key"), "signing CA (tls.crt, tls.key)"},
		{"cert-manager/tls.key mismatch", LayoutCertManager, with(f.certManager(), "tls.key", other.ca.KeyPEM), "signing CA (tls.crt, tls.key): private key does not match"},
		{"cert-manager/ca.crt without the CA", LayoutCertManager, with(f.certManager(), "ca.crt", other.ca.CertPEM), "ca.crt does not hold the CA in tls.crt"},
		{"knative/missing server-key.pem", LayoutKnative, without(f.knative(), "server-key.pem"), "knative layout: key server-key.pem is missing"},
		{"knative/server-key.pem mismatch", LayoutKnative, with(f.knative(), "server-key.pem", other.leaf.KeyPEM), "serving certificate (server-cert.pem, server-key.pem): private key does not match"},
		{"knative/leaf of another CA", LayoutKnative, with(with(f.knative(), "server-cert.pem", other.leaf.CertPEM), "server-key.pem", other.leaf.KeyPEM), "serving certificate server-cert.pem is not signed by the CA \"good-ca\""},
		{"knative/ca-cert.pem not a CA", LayoutKnative, with(f.knative(), "ca-cert.pem", f.leaf.CertPEM), "ca-cert.pem"},
		{"no opt-in/knative", LayoutEvercert, f.knative(), "holds knative's layout (ca-cert.pem, server-cert.pem, server-key.pem); set AuthorityConfig.Adopt to \"knative\""},
		{"no opt-in/cert-controller", LayoutEvercert, f.certController(), "cert-controller's layout? set AuthorityConfig.Adopt to \"cert-controller\""},
	} {
		n++
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(opaqueSecret(tc.data))
			writes := secretWrites(client)
			clk := clocktesting.NewFakeClock(testNow)
			a := runAdopting(t, client, clk, fmt.Sprintf("adopt-bad-%d", n), tc.layout, nil)
			waitFor(t, "the load error", func() bool { return a.LastError() != nil })
			err := a.LastError()
			assert.ErrorContains(t, err, "CA secret ns/ca: ")
			assert.ErrorContains(t, err, tc.want)
			waitFor(t, "the load error to be counted", func() bool { return certmetricstest.LoadErrors(t, a.Name()) > 0 })
			assert.Zero(t, writes.Load(), "nothing written")
			assert.Nil(t, a.Leaf(), "nothing served")
			assert.False(t, errors.Is(err, ErrNoSigningCA))
		})
	}
}

func TestAdoptUnknownLayout(t *testing.T) {
	_, err := New(Config{Namespace: "ns", SecretName: "ca", Client: fake.NewClientset(), Hosts: []string{"localhost"}, Adopt: "vault"})
	require.ErrorContains(t, err, `unknown secret layout "vault" to adopt`)
}
