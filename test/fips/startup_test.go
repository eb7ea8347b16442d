//go:build fips

package fips

import (
	"crypto/tls"
	"crypto/x509"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFIPSStartupRefusals: in FIPS 140-3 mode the server refuses at start,
// naming the flag and the mode, what Go's FIPS module would refuse in every
// handshake later: ChaCha20-Poly1305 and CBC suites (TLS 1.2 and 1.3
// names), TLS below 1.2, certificate files (default and SNI) with keys it
// does not approve, and a client CA bundle with such a CA. Every problem is
// reported at once, and no listener is opened.
func TestFIPSStartupRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	weakCA := issue(t, nil, keyRSA1024, "weak-client-ca")
	goodCA := issue(t, nil, keyP256, "good-ca")
	rsa1024Cert, rsa1024Key := writePair(t, dir, "rsa1024", issue(t, weakCA, keyRSA1024, "rsa1024.test", "rsa1024.test"))
	p224Cert, p224Key := writePair(t, dir, "p224", issue(t, goodCA, keyP224, "p224.test", "p224.test"))
	goodCert, goodKey := writePair(t, dir, "good", issue(t, goodCA, keyP256, "good.test", "good.test"))
	clientCAs := writeBundle(t, dir, "client-cas.crt", goodCA, weakCA)

	const aes128 = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
	for _, tc := range []struct {
		name    string
		godebug string
		args    []string
		want    []string // in the output; klog escapes quotes in the error
	}{
		{"ChaCha20 suite", "fips140=only", []string{"--tls-cipher-suites=" + aes128 + ",TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"},
			[]string{"--tls-cipher-suites: TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 not approved in FIPS 140-3 mode (GODEBUG=fips140=only)"}},
		{"CBC suite", "fips140=only", []string{"--tls-cipher-suites=" + aes128 + ",TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"},
			[]string{"--tls-cipher-suites: TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA not approved"}},
		{"TLS 1.3 ChaCha20 name", "fips140=only", []string{"--tls-cipher-suites=" + aes128 + ",TLS_CHACHA20_POLY1305_SHA256"},
			[]string{"--tls-cipher-suites: TLS_CHACHA20_POLY1305_SHA256 not approved"}},
		{"TLS 1.1", "fips140=only", []string{"--tls-min-version=VersionTLS11"},
			[]string{"--tls-min-version: VersionTLS11 is not approved in FIPS 140-3 mode"}},
		{"RSA-1024 certificate file", "fips140=only", []string{"--tls-cert-file=" + rsa1024Cert, "--tls-private-key-file=" + rsa1024Key},
			[]string{"--tls-cert-file " + rsa1024Cert + ": certificate 1 (subject ", "CN=rsa1024.test", "not approved in FIPS 140-3 mode: RSA 1024-bit key"}},
		{"P-224 SNI certificate", "fips140=only", []string{"--tls-sni-cert-key=" + goodCert + "," + goodKey, "--tls-sni-cert-key=" + p224Cert + "," + p224Key + ":p224.test"},
			[]string{"--tls-sni-cert-key[1] " + p224Cert + ": ", "ECDSA key on P-224"}},
		{"RSA-1024 client CA", "fips140=only", []string{"--client-ca-file=" + clientCAs},
			[]string{"--client-ca-file " + clientCAs + ": certificate 2 (subject ", "CN=weak-client-ca", "not approved in FIPS 140-3 mode: RSA 1024-bit key"}},
		{"ChaCha20 suite, build default fips140=on", "", []string{"--tls-cipher-suites=" + aes128 + ",TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"},
			[]string{"not approved in FIPS 140-3 mode (GODEBUG=fips140=on)"}},
		{"everything at once", "fips140=only", []string{
			"--tls-min-version=VersionTLS10", "--tls-cipher-suites=" + aes128 + ",TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
			"--tls-cert-file=" + rsa1024Cert, "--tls-private-key-file=" + rsa1024Key,
			"--tls-sni-cert-key=" + p224Cert + "," + p224Key, "--client-ca-file=" + clientCAs,
		}, []string{"--tls-min-version:", "--tls-cipher-suites:", "--tls-cert-file ", "--tls-sni-cert-key[0] ", "--client-ca-file "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runToExit(t, tc.godebug, append([]string{"--bind-address=127.0.0.1", "--secure-port=0"}, tc.args...)...)
			assert.NotZero(t, code, "the server started; output:\n%s", out)
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
			assert.NotContains(t, out, "serving on https://", "a listener was opened")
		})
	}
}

// TestFIPSRefusalsNeedFIPSMode: the same binary with GODEBUG=fips140=off
// serves what FIPS mode refuses (an RSA-1024 certificate, a ChaCha20
// suite): the refusals are FIPS mode's, not new general rules.
func TestFIPSRefusalsNeedFIPSMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := issue(t, nil, keyRSA1024, "weak-ca")
	certFile, keyFile := writePair(t, dir, "rsa1024", issue(t, ca, keyRSA1024, "localhost", "localhost"))
	srv := startServer(t, "fips140=off", "--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile,
		"--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256")
	assert.NotContains(t, srv.Output(), "FIPS 140-3 mode")

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	st, err := handshake(srv.Addr, &tls.Config{RootCAs: roots, ServerName: "localhost", MaxVersion: tls.VersionTLS12,
		CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256}, CurvePreferences: []tls.CurveID{tls.X25519}})
	require.NoError(t, err)
	assert.Equal(t, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256, st.CipherSuite)
	assert.Equal(t, tls.X25519, st.CurveID)
}

var helpDefaultSuites = regexp.MustCompile(`--tls-cipher-suites strings\s.*\(default \[([^\]]*)\]\)`)

// TestFIPSHelp: in FIPS mode --help offers, and defaults to, the approved
// suites only; with fips140=off the same binary offers ChaCha20 too.
func TestFIPSHelp(t *testing.T) {
	t.Parallel()
	code, out := runToExit(t, "fips140=only", "--help")
	require.Zero(t, code, out)
	require.Contains(t, out, "--tls-cipher-suites")
	assert.NotContains(t, out, "CHACHA20")
	assert.NotContains(t, out, "_CBC_")
	m := helpDefaultSuites.FindStringSubmatch(out)
	require.NotNil(t, m, "no default in --tls-cipher-suites help:\n%s", out)
	assert.Equal(t, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", m[1])

	code, out = runToExit(t, "fips140=off", "--help")
	require.Zero(t, code, out)
	assert.True(t, strings.Contains(out, "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"), "fips140=off: ChaCha20 is a possible value again")
}
