//go:build fips

package fips

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// TestFIPSBuild: the binary under test is a GOFIPS140=latest build, whose
// default GODEBUG is fips140=on.
func TestFIPSBuild(t *testing.T) {
	settings := buildSettings(t, requireFIPSServer(t))
	assert.Equal(t, "latest", settings["GOFIPS140"], "GOFIPS140 build setting")
	assert.Contains(t, strings.Split(settings["DefaultGODEBUG"], ","), "fips140=on", "DefaultGODEBUG")
	t.Logf("build settings: GOFIPS140=%s DefaultGODEBUG=%s", settings["GOFIPS140"], settings["DefaultGODEBUG"])
}

var fipsModeLine = regexp.MustCompile(`FIPS 140-3 mode.*godebug="(fips140=[a-z]+)".*module="([^"]+)"`)

// requireFIPSModeLogged asserts the server logged that it runs in mode.
func requireFIPSModeLogged(t *testing.T, srv *serverProc, mode string) {
	t.Helper()
	m := fipsModeLine.FindStringSubmatch(srv.Output())
	require.NotNil(t, m, "no FIPS 140-3 mode line in the server output:\n%s", srv.Output())
	assert.Equal(t, mode, m[1])
	t.Logf("server: FIPS 140-3 mode %s, module %s", m[1], m[2])
}

var selfcheckSuccess = regexp.MustCompile(`(?m)^evercert_loopback_selfcheck_total\{result="success"\} ([0-9.e+]+)$`)

// TestFIPSSelfSignedDefault runs the embedded default (ECDSA P-256,
// default suites) under GODEBUG=fips140=only: sslscan sees only approved
// protocols, suites and groups; a normal Go client negotiates every
// approved group (the ML-KEM hybrids included) and is refused X25519,
// ChaCha20-Poly1305, CBC and TLS 1.1; the server signs only with approved
// algorithms; HTTP/2 works, and so does the loopback self-check (client-go
// inside the server, in fips140=only mode too).
func TestFIPSSelfSignedDefault(t *testing.T) {
	t.Parallel()
	requireSSLScan(t)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	srv := startServer(t, "fips140=only", "--ca-bundle-file="+caFile)
	requireFIPSModeLogged(t, srv, "fips140=only")

	scan, _ := sslscan(t, srv.Addr, "")
	t.Logf("sslscan: %s", checkFIPSPosture(t, scan, "EC"))

	bundle, err := os.ReadFile(caFile)
	require.NoError(t, err)
	base := &tls.Config{RootCAs: poolOf(t, bundle), ServerName: "localhost"}
	t.Logf("Go client: %s", checkGoClient(t, srv.Addr, base, false))

	sigs := probeSignatures(t, srv.Addr, "localhost", tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
	assert.Equal(t, []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256}, sigs[tls.VersionTLS13], "TLS 1.3 signature algorithms of a P-256 key")
	t.Logf("signature algorithms: TLS 1.3 %v; TLS 1.2 %v", sigs[tls.VersionTLS13], sigs[tls.VersionTLS12])

	code, proto, _, err := get(srv.Addr, "/healthz", base)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "HTTP/2.0", proto)

	// The self-check ticks every second; wait (bounded) for one success.
	deadline := time.Now().Add(startTimeout)
	for {
		code, _, body, err := get(srv.Addr, "/metrics", base)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
		if m := selfcheckSuccess.FindStringSubmatch(body); m != nil {
			if n, _ := strconv.ParseFloat(m[1], 64); n > 0 {
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "no successful loopback self-check under fips140=only:\n%s", srv.Output())
		time.Sleep(200 * time.Millisecond)
	}
	assert.NotContains(t, srv.Output(), "Loopback self-check failed")
}

// TestFIPSFilesSNIAndClientCA serves, under GODEBUG=fips140=only, a default
// certificate from files (ECDSA P-256) and SNI certificates of every other
// approved kind (RSA-2048 from its own RSA CA, ECDSA P-384, Ed25519), and
// verifies client certificates from a --client-ca-file (an ECDSA P-384
// CA): each name serves its certificate with only approved parameters; a
// client certificate from that CA is accepted (mTLS), one from another CA
// is refused, and so is an RSA-1024 one from the trusted CA (Go's FIPS
// mode refuses the chain). Last, SIGTERM with an HTTP/2 request that cannot
// finish: the server cuts it at --shutdown-timeout, names it, and exits 0.
func TestFIPSFilesSNIAndClientCA(t *testing.T) {
	t.Parallel()
	requireSSLScan(t)
	dir := t.TempDir()
	ecCA := issue(t, nil, keyP256, "fips-serving-ca")
	rsaCA := issue(t, nil, keyRSA2048, "fips-rsa-ca")
	def := issue(t, ecCA, keyP256, "localhost", "localhost", "127.0.0.1")
	rsaLeaf := issue(t, rsaCA, keyRSA2048, "rsa.fips.test", "rsa.fips.test")
	p384Leaf := issue(t, ecCA, keyP384, "p384.fips.test", "p384.fips.test")
	edLeaf := issue(t, ecCA, keyEd25519, "ed25519.fips.test", "ed25519.fips.test")
	clientCA := issue(t, nil, keyP384, "fips-client-ca")
	otherCA := issue(t, nil, keyP256, "other-client-ca")

	defCert, defKey := writePair(t, dir, "default", def)
	args := []string{"--tls-cert-file=" + defCert, "--tls-private-key-file=" + defKey,
		"--client-ca-file=" + writeBundle(t, dir, "client-ca.crt", clientCA)}
	for name, c := range map[string]*pki.Issued{"rsa": rsaLeaf, "p384": p384Leaf, "ed25519": edLeaf} {
		certFile, keyFile := writePair(t, dir, name, c)
		args = append(args, "--tls-sni-cert-key="+certFile+","+keyFile)
	}
	// --v=4 logs TLS handshake errors, so the reason a client is refused
	// can be checked.
	srv := startServer(t, "fips140=only", append(args, "--v=4")...)
	requireFIPSModeLogged(t, srv, "fips140=only")

	roots := x509.NewCertPool()
	roots.AddCert(ecCA.Cert)
	roots.AddCert(rsaCA.Cert)
	for _, tc := range []struct {
		name, keyType string
		suite12       uint16
		sigs13        []tls.SignatureScheme
	}{
		{"localhost", "EC", tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256}},
		{"rsa.fips.test", "RSA", tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, []tls.SignatureScheme{tls.PSSWithSHA256, tls.PSSWithSHA384, tls.PSSWithSHA512}},
		{"p384.fips.test", "EC", tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, []tls.SignatureScheme{tls.ECDSAWithP384AndSHA384}},
		{"ed25519.fips.test", "ED25519", tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, []tls.SignatureScheme{tls.Ed25519}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := &tls.Config{RootCAs: roots, ServerName: tc.name}
			st, err := handshake(srv.Addr, base)
			require.NoError(t, err)
			require.NotEmpty(t, st.PeerCertificates)
			assert.Equal(t, tc.name, st.PeerCertificates[0].Subject.CommonName, "certificate served for SNI %s", tc.name)
			t.Logf("Go client: %s", checkGoClient(t, srv.Addr, base, tc.keyType == "RSA"))

			sigs := probeSignatures(t, srv.Addr, tc.name, tc.suite12)
			assert.Equal(t, tc.sigs13, sigs[tls.VersionTLS13], "TLS 1.3 signature algorithms")
			t.Logf("signature algorithms: TLS 1.3 %v; TLS 1.2 %v", sigs[tls.VersionTLS13], sigs[tls.VersionTLS12])

			scan, _ := sslscan(t, srv.Addr, tc.name, "--show-client-cas")
			t.Logf("sslscan: %s", checkFIPSPosture(t, scan, tc.keyType))
			var cas []string
			for _, ca := range scan.ClientCAs {
				cas = append(cas, strings.TrimSpace(ca))
			}
			assert.Equal(t, []string{"/CN=fips-client-ca"}, cas, "client CAs the server asks for")
		})
	}

	t.Run("mTLS", func(t *testing.T) {
		ecRoots := x509.NewCertPool()
		ecRoots.AddCert(ecCA.Cert)
		withClient := func(c *pki.Issued) *tls.Config {
			cfg := &tls.Config{RootCAs: ecRoots, ServerName: "localhost"}
			if c != nil {
				pair, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
				require.NoError(t, err)
				// Always present it: Go's client would otherwise send no
				// certificate when its issuer is not among the server's
				// acceptable CAs.
				cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
			}
			return cfg
		}
		trusted := issue(t, clientCA, keyP256, "trusted-client")
		trustedRSA := issue(t, clientCA, keyRSA2048, "trusted-rsa-client")
		untrusted := issue(t, otherCA, keyP256, "untrusted-client")
		weak := issue(t, clientCA, keyRSA1024, "rsa-1024-client")

		for _, c := range []*pki.Issued{trusted, trustedRSA} {
			for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
				cfg := withClient(c)
				cfg.MaxVersion = v
				code, _, _, err := get(srv.Addr, "/healthz", cfg)
				if assert.NoError(t, err, "%s client certificate over %s", c.Cert.Subject.CommonName, tls.VersionName(v)) {
					assert.Equal(t, http.StatusOK, code)
				}
			}
		}
		code, _, _, err := get(srv.Addr, "/healthz", withClient(nil))
		if assert.NoError(t, err, "no client certificate (optional)") {
			assert.Equal(t, http.StatusOK, code)
		}
		_, _, _, err = get(srv.Addr, "/healthz", withClient(untrusted))
		assert.Error(t, err, "client certificate from a CA not in --client-ca-file was accepted")
		_, _, _, err = get(srv.Addr, "/healthz", withClient(weak))
		assert.Error(t, err, "RSA-1024 client certificate accepted in FIPS mode")
		assert.True(t, srv.waitForOutput("tls: no FIPS compatible certificate chains found"),
			"the server did not log that it refused the RSA-1024 client chain for FIPS (see its log)")
	})

	// SIGTERM with a request in flight that cannot finish (an HTTP/2
	// client that stopped reading, as a client on a loaded machine may):
	// the server cuts it at --shutdown-timeout, names it, and exits 0. Once
	// this made the server exit 1 with "shutting down: context deadline
	// exceeded"; now it is opened on purpose, so every run takes that path.
	t.Run("shutdown", func(t *testing.T) {
		stalled, err := tlstest.StalledHTTP2Request(srv.Addr, &tls.Config{RootCAs: roots, ServerName: "localhost"}, "/healthz")
		require.NoError(t, err)
		defer stalled.Close()
		srv.stop(t) // fails the test unless the server exits 0
		m := shutdownWarning.FindStringSubmatch(srv.Output())
		require.NotNil(t, m, "no warning naming the connections the shutdown cut:\n%s", srv.Output())
		assert.Contains(t, m[1], stalled.LocalAddr().String()+" (active, h2 for ", "the warning names the stalled HTTP/2 request")
	})
}
