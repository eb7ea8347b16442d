package pki

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCheckFIPSPublicKey: the rules of crypto/tls and crypto/rsa in FIPS
// 140-3 mode, on public keys built without generating slow RSA keys. The
// same rules are checked against Go's real behaviour under
// GODEBUG=fips140=only by test/fips (make test-fips).
func TestCheckFIPSPublicKey(t *testing.T) {
	ec := func(c elliptic.Curve) crypto.PublicKey {
		k, err := ecdsa.GenerateKey(c, rand.Reader)
		require.NoError(t, err)
		return k.Public()
	}
	rsaPub := func(bits, e int) crypto.PublicKey {
		n := new(big.Int).Lsh(big.NewInt(1), uint(bits-1)) // exactly bits bits
		n.SetBit(n, 0, 1)
		return &rsa.PublicKey{N: n, E: e}
	}
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	x25519, err := ecdh.X25519().GenerateKey(rand.Reader)
	require.NoError(t, err)

	for _, tc := range []struct {
		name    string
		pub     crypto.PublicKey
		wantErr string // empty: approved
	}{
		{"P-256", ec(elliptic.P256()), ""},
		{"P-384", ec(elliptic.P384()), ""},
		{"P-521", ec(elliptic.P521()), ""},
		{"P-224", ec(elliptic.P224()), "ECDSA key on P-224"},
		{"RSA-2048", rsaPub(2048, 65537), ""},
		{"RSA-3072", rsaPub(3072, 65537), ""},
		{"RSA-4096", rsaPub(4096, 65537), ""},
		{"RSA-1024", rsaPub(1024, 65537), "RSA 1024-bit key"},
		{"RSA-2047", rsaPub(2047, 65537), "RSA 2047-bit key"},
		{"RSA-2049 (odd size)", rsaPub(2049, 65537), "odd size 2049"},
		{"RSA e=3", rsaPub(2048, 3), "public exponent 3"},
		{"RSA e=65536+2 (even)", rsaPub(2048, 65538), "public exponent 65538"},
		{"Ed25519", edPub, ""},
		{"X25519 (not a signature key)", x25519.PublicKey(), "*ecdh.PublicKey key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckFIPSPublicKey(tc.pub)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, ErrNotFIPSApproved)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// TestEveryKeyTypeIsFIPSApproved: every key evercert generates can serve in
// FIPS 140-3 mode.
func TestEveryKeyTypeIsFIPSApproved(t *testing.T) {
	for _, kt := range KeyTypes {
		f := fixtureFor(t, kt)
		assert.NoError(t, CheckFIPSCertificates([]*x509.Certificate{f.leaf.Cert, f.ca.Cert}), kt)
		pair, err := tls.X509KeyPair(f.leaf.CertPEM, f.leaf.KeyPEM)
		require.NoError(t, err)
		assert.NoError(t, CheckFIPSKeyPair(pair), kt)
	}
}

// TestCheckFIPSKeyPairChecksTheChain: an intermediate with an unapproved
// key fails the pair, naming the intermediate; so does a multi-prime RSA
// private key.
func TestCheckFIPSKeyPairChecksTheChain(t *testing.T) {
	f := fixtureFor(t, ECDSAP256)
	weak, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "weak-intermediate"},
		NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.ca.Cert, weak.Public(), f.ca.Key)
	require.NoError(t, err)
	pair, err := tls.X509KeyPair(join(f.leaf.CertPEM, EncodeCertPEM(der)), f.leaf.KeyPEM)
	require.NoError(t, err)
	err = CheckFIPSKeyPair(pair)
	assert.ErrorIs(t, err, ErrNotFIPSApproved)
	assert.ErrorContains(t, err, `certificate 2 (subject "CN=weak-intermediate")`)
	assert.ErrorContains(t, err, "P-224")

	rsaFixture := fixtureFor(t, RSA2048)
	rsaPair, err := tls.X509KeyPair(rsaFixture.leaf.CertPEM, rsaFixture.leaf.KeyPEM)
	require.NoError(t, err)
	key := *rsaPair.PrivateKey.(*rsa.PrivateKey)
	key.Primes = append(key.Primes[:2:2], big.NewInt(3))
	rsaPair.PrivateKey = &key
	err = CheckFIPSKeyPair(rsaPair)
	assert.ErrorIs(t, err, ErrNotFIPSApproved)
	assert.ErrorContains(t, err, "multi-prime")
}
