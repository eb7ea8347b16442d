package authority

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// TestAuthoritySignLeafOnlyWithObservedCA drives an Authority's Run loop on
// a fake clock through a CA rotation whose observer holds the successor
// back. SignLeaf signs with the signing CA only: while the successor is
// published but not observed, leaves come from the old CA, capped at its
// expiry, and a request needing more than is left waits
// (CAEndsTooSoonError); listeners hear when the successor signs, and the
// next leaf is the successor's. Every leaf is issued to the caller's key
// and serves a real TLS handshake verified against the Authority's bundle.
func TestAuthoritySignLeafOnlyWithObservedCA(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	obs := &testObserver{}
	a, err := New(Config{
		Name: "sign-leaf", Namespace: "ns", SecretName: "ca", Client: fake.NewClientset(),
		Hosts: []string{"signer.ns.svc"}, Lifetime: 6 * time.Hour, CALifetime: 48 * time.Hour, CARenewBefore: 16 * time.Hour,
		PropagationDelay: time.Hour, Observers: []Observer{obs}, Clock: clk, DisableReplicaAnnouncements: true,
	})
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	req := LeafRequest{
		PublicKey: key.Public(), CommonName: "pod.ns.svc", DNSNames: []string{"pod.ns.svc"},
		Lifetime: 24 * time.Hour, MinLifetime: time.Hour, Backdate: 2 * time.Minute,
	}
	_, err = a.SignLeaf(req)
	require.ErrorIs(t, err, ErrNoSigningCA, "nothing signs before the CA Secret is read")

	heard := &countingListener{}
	a.AddListener(heard)
	runInBackground(t, a.Run)
	waitFor(t, "the first CA", func() bool { return a.Leaf() != nil })
	waitBlocked(t, clk)
	first := a.Status().Signing

	handshake := func(leaf *SignedLeaf) error {
		t.Helper()
		pair := tls.Certificate{Certificate: [][]byte{leaf.Cert.Raw}, PrivateKey: key, Leaf: leaf.Cert}
		addr := tlstest.Server(t, &tls.Config{Certificates: []tls.Certificate{pair}})
		_, err := tlstest.Handshake(addr, &tls.Config{ServerName: "pod.ns.svc", RootCAs: tlstest.Pool(t, a.CurrentCABundleContent()), Time: clk.Now})
		return err
	}

	leaf, err := a.SignLeaf(req)
	require.NoError(t, err)
	assert.Equal(t, first.Serial, serial(leaf.CA))
	assert.True(t, leaf.Cert.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()), "issued to the caller's key")
	assert.Equal(t, clk.Now().Add(-2*time.Minute).Truncate(time.Second), leaf.Cert.NotBefore)
	assert.Equal(t, 24*time.Hour, leaf.Cert.NotAfter.Sub(leaf.Cert.NotBefore))
	assert.False(t, leaf.Capped)
	assert.Equal(t, []string{"pod.ns.svc"}, leaf.Cert.DNSNames)
	got, err := pki.ParseCABundle(leaf.CertPEM)
	require.NoError(t, err)
	require.Len(t, got, 1, "the PEM is the leaf alone")
	require.NoError(t, handshake(leaf))

	// Past the CA's renew-before: the successor is published, but the
	// observer does not hold it, so it must not sign however long it waits.
	for a.Status().Successor == nil {
		clk.Step(time.Hour)
		waitBlocked(t, clk)
	}
	succ := a.Status().Successor
	for clk.Now().Before(first.NotAfter.Add(-2 * time.Hour)) {
		clk.Step(time.Hour)
		waitBlocked(t, clk)
		leaf, err := a.SignLeaf(req)
		require.NoError(t, err)
		require.Equal(t, first.Serial, serial(leaf.CA), "signed by a successor nobody observed")
		require.NotEqual(t, succ.Serial, serial(leaf.CA))
		if leaf.Capped {
			assert.Equal(t, first.NotAfter, leaf.Cert.NotAfter, "capped at the CA's expiry")
		}
		require.NoError(t, handshake(leaf))
	}
	// Less than MinLifetime left on the old CA: wait, do not sign short.
	clk.Step(first.NotAfter.Sub(clk.Now()) - 30*time.Minute)
	waitBlocked(t, clk)
	_, err = a.SignLeaf(req)
	var tooSoon *CAEndsTooSoonError
	require.ErrorAs(t, err, &tooSoon)
	assert.Equal(t, first.CommonName, tooSoon.CA)
	assert.Contains(t, err.Error(), first.CommonName)

	before := heard.n.Load()
	obs.set(true)
	waitFor(t, "the successor to sign", func() bool { return a.Status().Signing.Serial == succ.Serial })
	waitFor(t, "the listeners to hear of it", func() bool { return heard.n.Load() > before })
	leaf, err = a.SignLeaf(req)
	require.NoError(t, err)
	assert.Equal(t, succ.Serial, serial(leaf.CA))
	assert.Equal(t, 24*time.Hour, leaf.Cert.NotAfter.Sub(leaf.Cert.NotBefore))
	require.NoError(t, handshake(leaf))
	assert.Zero(t, a.Status().UnsafeRotations)
}

// TestAuthoritySignLeafRefusesBadRequests: a request without a key or a
// lifetime, or with a negative backdate, is an error about the request, not
// "wait for the CA".
func TestAuthoritySignLeafRefusesBadRequests(t *testing.T) {
	a := newTestAuthority(t, fake.NewClientset(), clocktesting.NewFakeClock(testNow), "sign-leaf-bad")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	for name, req := range map[string]LeafRequest{
		"no key":            {Lifetime: time.Hour},
		"no lifetime":       {PublicKey: key.Public()},
		"negative backdate": {PublicKey: key.Public(), Lifetime: time.Hour, Backdate: -time.Minute},
	} {
		_, err := a.SignLeaf(req)
		require.Error(t, err, name)
		assert.False(t, errors.Is(err, ErrNoSigningCA), name)
	}
}
