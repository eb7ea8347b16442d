package authority

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"

	"github.com/evercert/evercert/dynamiccert"
)

func TestParseKeyTypes(t *testing.T) {
	kts, err := dynamiccert.ParseKeyTypes([]string{"ECDSA-P256", " rsa-2048"})
	require.NoError(t, err)
	assert.Equal(t, []dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA2048}, kts)
	for _, bad := range [][]string{nil, {""}, {"dsa"}, {"rsa-2048", "RSA-2048"}} {
		_, err := dynamiccert.ParseKeyTypes(bad)
		assert.Error(t, err, "%q", bad)
	}
	_, err = dynamiccert.ParseKeyType("ed448")
	assert.ErrorContains(t, err, "ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072", "the error lists the supported types")
}

func TestCAKeyType(t *testing.T) {
	assert.Equal(t, dynamiccert.ECDSAP256, caKeyType([]dynamiccert.KeyType{dynamiccert.ECDSAP256}))
	assert.Equal(t, dynamiccert.ECDSAP384, caKeyType([]dynamiccert.KeyType{dynamiccert.ECDSAP384, dynamiccert.ECDSAP256}))
	assert.Equal(t, dynamiccert.RSA3072, caKeyType([]dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA3072, dynamiccert.RSA2048}), "the first RSA type signs, so RSA-only clients verify every chain")
}

// TestSelfSignedDualKeyTypes: with two key types the provider makes one
// leaf per type for the same names, signed by one RSA CA, serves the second
// through Alternatives, and replaces both at once in its Run loop,
// notifying the alternative's listeners.
func TestSelfSignedDualKeyTypes(t *testing.T) {
	const lifetime = time.Hour
	clk := clocktesting.NewFakeClock(testNow)
	s, err := NewSelfSigned(SelfSignedConfig{Name: "dual", Lifetime: lifetime, Clock: clk, KeyTypes: []dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA2048}})
	require.NoError(t, err)
	alts := s.Alternatives()
	require.Len(t, alts, 1)
	alt := alts[0].(*alternative)
	assert.Equal(t, "dual/rsa-2048", alt.Name())
	assert.Equal(t, s.SNINames(), alt.SNINames())

	leaves := func() (*x509.Certificate, *x509.Certificate) { return s.Leaf(), alt.Leaf() }
	ecdsaLeaf, rsaLeaf := leaves()
	require.IsType(t, &ecdsa.PublicKey{}, ecdsaLeaf.PublicKey)
	require.IsType(t, &rsa.PublicKey{}, rsaLeaf.PublicKey)
	assert.Equal(t, ecdsaLeaf.DNSNames, rsaLeaf.DNSNames)
	assert.Equal(t, ecdsaLeaf.IPAddresses, rsaLeaf.IPAddresses)
	assert.Equal(t, ecdsaLeaf.Subject, rsaLeaf.Subject)
	cas := mustParseBundle(t, s.CurrentCABundleContent())
	require.Len(t, cas, 1)
	assert.IsType(t, &rsa.PublicKey{}, cas[0].PublicKey, "the CA is RSA when an RSA leaf is served")
	for _, leaf := range []*x509.Certificate{ecdsaLeaf, rsaLeaf} {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: tlstest.Pool(t, s.CurrentCABundleContent()), DNSName: "localhost", CurrentTime: clk.Now()})
		require.NoError(t, err, "%s leaf", leaf.PublicKeyAlgorithm)
	}
	certPEM, keyPEM := alt.CurrentCertKeyContent()
	pair, err := pki.ParseCertKey(certPEM, keyPEM, clk.Now())
	require.NoError(t, err)
	assert.Equal(t, rsaLeaf.SerialNumber, pair.Leaf.SerialNumber)

	changes := &countingListener{}
	alt.AddListener(changes)
	runInBackground(t, s.Run)
	waitBlocked(t, clk)
	for range 3 {
		before := changes.n.Load()
		clk.SetTime(s.RenewAt())
		waitFor(t, "the renewal", func() bool { return s.Leaf().SerialNumber.Cmp(ecdsaLeaf.SerialNumber) != 0 })
		waitBlocked(t, clk)
		nextE, nextR := leaves()
		assert.NotEqual(t, rsaLeaf.SerialNumber, nextR.SerialNumber, "the RSA leaf is renewed with the ECDSA one")
		assert.Equal(t, nextE.NotAfter, nextR.NotAfter)
		assert.Greater(t, changes.n.Load(), before, "the alternative's listeners hear of the renewal")
		ecdsaLeaf, rsaLeaf = nextE, nextR
	}
}

// TestAuthorityAlternativeBeforeFirstLeaf: an Authority's alternative has
// no content before the first reconcile, like the Authority itself.
func TestAuthorityAlternativeBeforeFirstLeaf(t *testing.T) {
	a, err := New(Config{
		Namespace: "ns", SecretName: "ca", Client: fake.NewClientset(), Hosts: []string{"webhook.ns.svc"},
		KeyTypes: []dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA2048}, DisableReplicaAnnouncements: true,
	})
	require.NoError(t, err)
	require.Len(t, a.Alternatives(), 1)
	cert, key := a.Alternatives()[0].CurrentCertKeyContent()
	assert.Nil(t, cert)
	assert.Nil(t, key)
	assert.Equal(t, []dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA2048}, a.cfg.KeyTypes)
}
