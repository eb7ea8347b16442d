package pki

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSignPublicKey: the leaf is issued to the given key (no key is made),
// with exactly the validity asked for at second precision, chains to the
// CA, and serves and authenticates clients like IssueLeaf's.
func TestSignPublicKey(t *testing.T) {
	ca, err := NewCA(Request{CommonName: "ca", Now: testNow, Lifetime: 48 * time.Hour})
	require.NoError(t, err)
	rsaKey, err := GenerateKey(RSA3072)
	require.NoError(t, err)
	ecKey, err := GenerateKey(ECDSAP384)
	require.NoError(t, err)
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)

	for name, key := range map[string]crypto.Signer{"rsa": rsaKey, "ecdsa": ecKey, "ed25519": edKey} {
		t.Run(name, func(t *testing.T) {
			nb := testNow.Add(-2*time.Minute + 700*time.Millisecond)
			na := nb.Add(24 * time.Hour)
			cert, certPEM, err := SignPublicKey(ca, key.Public(), "svc.ns.svc", []string{"svc.ns.svc", "svc.ns.svc.cluster.local"}, nb, na)
			require.NoError(t, err)
			assert.True(t, cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(key.Public()), "issued to the given key")
			assert.Equal(t, nb.Truncate(time.Second), cert.NotBefore)
			assert.Equal(t, na.Truncate(time.Second), cert.NotAfter)
			assert.Equal(t, 24*time.Hour, cert.NotAfter.Sub(cert.NotBefore), "the lifetime survives truncation")
			assert.False(t, cert.IsCA)
			_, isRSA := key.(*rsa.PrivateKey)
			assert.Equal(t, isRSA, cert.KeyUsage&x509.KeyUsageKeyEncipherment != 0, "KeyEncipherment iff RSA")

			parsed, err := ParseCABundle(certPEM)
			require.NoError(t, err)
			require.Len(t, parsed, 1)
			assert.Equal(t, cert.Raw, parsed[0].Raw)
			roots := x509.NewCertPool()
			roots.AddCert(ca.Cert)
			_, err = cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: testNow, DNSName: "svc.ns.svc.cluster.local"})
			assert.NoError(t, err)
		})
	}
}

// TestSignPublicKeyRefusesBadValidity: nothing is capped here; a validity
// that is empty or leaves the CA's is an error naming the CA.
func TestSignPublicKeyRefusesBadValidity(t *testing.T) {
	ca, err := NewCA(Request{CommonName: "short-ca", Now: testNow, Lifetime: time.Hour})
	require.NoError(t, err)
	key, err := GenerateKey(ECDSAP256)
	require.NoError(t, err)
	for name, v := range map[string][2]time.Time{
		"past the CA":       {testNow, testNow.Add(2 * time.Hour)},
		"before the CA":     {ca.Cert.NotBefore.Add(-time.Second), testNow},
		"empty":             {testNow, testNow},
		"empty after trunc": {testNow.Add(100 * time.Millisecond), testNow.Add(900 * time.Millisecond)},
	} {
		_, _, err := SignPublicKey(ca, key.Public(), "x", nil, v[0], v[1])
		assert.Error(t, err, name)
	}
	_, _, err = SignPublicKey(ca, key.Public(), "x", nil, testNow, testNow.Add(2*time.Hour))
	assert.ErrorContains(t, err, "short-ca")
	_, _, err = SignPublicKey(nil, key.Public(), "x", nil, testNow, testNow.Add(time.Minute))
	assert.Error(t, err)
	_, _, err = SignPublicKey(ca, nil, "x", nil, testNow, testNow.Add(time.Minute))
	assert.Error(t, err)
}
