//go:build fips

package fips

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/tlstest"
)

// TestFIPSDualKeyTypes runs the FIPS build under GODEBUG=fips140=only with
// --self-signed-key-types=ecdsa-p256,rsa-2048: every key type is approved,
// so it starts, and a default Go client gets the ECDSA leaf while a Go
// client limited to TLS 1.2 and an RSA suite, and openssl on TLS 1.3
// offering only RSA-PSS, get the RSA leaf; all verify against the bundle.
func TestFIPSDualKeyTypes(t *testing.T) {
	t.Parallel()
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	srv := startServer(t, "fips140=only", "--self-signed-key-types=ecdsa-p256,rsa-2048", "--ca-bundle-file="+caFile)
	requireFIPSModeLogged(t, srv, "fips140=only")
	bundle, err := os.ReadFile(caFile)
	require.NoError(t, err)
	roots := poolOf(t, bundle)

	st, err := handshake(srv.Addr, &tls.Config{RootCAs: roots, ServerName: "localhost"})
	require.NoError(t, err, "default Go client")
	assert.Equal(t, x509.ECDSA, st.PeerCertificates[0].PublicKeyAlgorithm)

	st, err = handshake(srv.Addr, &tls.Config{RootCAs: roots, ServerName: "localhost",
		MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}})
	require.NoError(t, err, "RSA-only TLS 1.2 Go client")
	assert.Equal(t, x509.RSA, st.PeerCertificates[0].PublicKeyAlgorithm)

	leaf, err := tlstest.OpenSSL(t, srv.Addr, "localhost", "-tls1_3", "-sigalgs", "rsa_pss_rsae_sha256:rsa_pss_pss_sha256")
	require.NoError(t, err, "openssl, TLS 1.3, RSA-PSS only")
	assert.Equal(t, x509.RSA, leaf.PublicKeyAlgorithm)
	_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost"})
	assert.NoError(t, err)
}
