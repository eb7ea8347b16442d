package pki

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// splitCase is one SplitCertKey input; want nil means success, and then
// wantCerts is the expected chain PEM. The table is shared with the fuzz
// seed corpus.
type splitCase struct {
	name      string
	in        []byte
	want      error
	wantCerts []byte
	wantKey   []byte
}

func splitCases(tb testing.TB) []splitCase {
	tb.Helper()
	p256 := fixtureFor(tb, ECDSAP256)
	rsa2048 := fixtureFor(tb, RSA2048)
	chain, err := chainFixture()
	require.NoError(tb, err)
	leaf := p256.leaf
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsa2048.leaf.Key.(*rsa.PrivateKey))})
	ecParams := ecParamsKeyPEM(tb, leaf.Key)
	encrypted := pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: bytes.Repeat([]byte{0xa5}, 64)})
	return []splitCase{
		// The kubelet's podCertificate credential bundle: PKCS#8 key, then the chain.
		{name: "valid/podCertificate layout", in: join(chain.leaf.KeyPEM, chain.leaf.CertPEM), wantCerts: chain.leaf.CertPEM, wantKey: chain.leaf.KeyPEM},
		{name: "valid/chain then key", in: join(chain.leaf.CertPEM, chain.leaf.KeyPEM), wantCerts: chain.leaf.CertPEM, wantKey: chain.leaf.KeyPEM},
		{name: "valid/pkcs1 key last", in: join(rsa2048.leaf.CertPEM, pkcs1), wantCerts: rsa2048.leaf.CertPEM, wantKey: pkcs1},
		{name: "valid/EC PARAMETERS and SEC 1 key first", in: join(ecParams, leaf.CertPEM), wantCerts: leaf.CertPEM, wantKey: ecParams},
		{name: "valid/text before and white space after", in: join([]byte("Bag Attributes\n"), leaf.KeyPEM, leaf.CertPEM, []byte("\n\n")), wantCerts: leaf.CertPEM, wantKey: leaf.KeyPEM},

		{name: "empty", in: []byte(" \n"), want: ErrEmpty},
		{name: "too large", in: join(leaf.KeyPEM, leaf.CertPEM, bytes.Repeat([]byte{' '}, MaxPEMSize)), want: ErrTooLarge},
		{name: "not PEM", in: []byte("not a certificate"), want: ErrMalformedPEM},
		{name: "certificate only", in: leaf.CertPEM, want: ErrMalformedPEM},
		{name: "key only", in: leaf.KeyPEM, want: ErrMalformedPEM},
		{name: "two keys", in: join(leaf.KeyPEM, leaf.CertPEM, rsa2048.leaf.KeyPEM), want: ErrMalformedPEM},
		{name: "EC PARAMETERS without a key", in: join(ecParams[:bytes.Index(ecParams, []byte("-----BEGIN EC PRIVATE KEY"))], leaf.CertPEM), want: ErrMalformedPEM},
		{name: "public key block", in: join(leaf.CertPEM, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1}})), want: ErrMalformedPEM},
		{name: "trailing garbage", in: join(leaf.KeyPEM, leaf.CertPEM, []byte("garbage")), want: ErrMalformedPEM},
		{name: "truncated", in: join(leaf.KeyPEM, leaf.CertPEM)[:len(leaf.KeyPEM)+len(leaf.CertPEM)/2], want: ErrMalformedPEM},
		{name: "encrypted key", in: join(encrypted, leaf.CertPEM), want: ErrEncryptedKey},
	}
}

func TestSplitCertKey(t *testing.T) {
	p256 := fixtureFor(t, ECDSAP256)
	for _, tc := range splitCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			in := bytes.Clone(tc.in)
			certPEM, keyPEM, err := SplitCertKey(tc.in)
			assert.Equal(t, in, tc.in, "input modified")
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
				assert.Nil(t, certPEM)
				assert.Nil(t, keyPEM)
				assert.Contains(t, err.Error(), "certificate and key")
				assertNoKeyMaterial(t, err, p256.leaf.KeyPEM, fixtureFor(t, RSA2048).leaf.KeyPEM)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, string(tc.wantCerts), string(certPEM))
			assert.Equal(t, string(tc.wantKey), string(keyPEM))
			// What it returns is a pair ParseCertKey accepts.
			kp, err := ParseCertKey(certPEM, keyPEM, testNow)
			require.NoError(t, err)
			assert.Len(t, kp.TLS.Certificate, bytes.Count(tc.wantCerts, []byte("-----BEGIN CERTIFICATE")))
		})
	}
}
