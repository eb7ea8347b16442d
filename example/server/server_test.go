package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/tlstest"
)

var servingLine = regexp.MustCompile(`serving on https://([0-9.:\[\]a-f]+)`)

// startServer runs the example server as a subprocess on a free port and
// returns the address it serves on.
func startServer(t *testing.T, args ...string) string {
	t.Helper()
	bin := proctest.Build(t, "github.com/evercert/evercert/example/server")
	_, addr := proctest.Start(t, bin, servingLine, append([]string{"--secure-port=0", "--loopback-selfcheck-interval=100ms"}, args...)...)
	return addr
}

func getBody(t *testing.T, cfg *tls.Config, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, body)
	return string(body)
}

func TestExampleServerSelfSigned(t *testing.T) {
	bundle := filepath.Join(t.TempDir(), "ca.crt")
	addr := startServer(t, "--ca-bundle-file="+bundle, "--loopback-validity=2s")
	pem, err := os.ReadFile(bundle)
	require.NoError(t, err)
	cfg := &tls.Config{RootCAs: tlstest.Pool(t, pem), ServerName: "localhost"}

	page := getBody(t, cfg, "https://"+addr+"/")
	assert.Contains(t, page, "self-signed")
	assert.Contains(t, page, "loopback")
	assert.Contains(t, getBody(t, cfg, "https://"+addr+"/readyz?verbose"), "[+]serving-certificate ok")

	// The loopback certificate rotates every ~1.3 s; the self-check keeps
	// succeeding through it.
	time.Sleep(4 * time.Second)
	metrics := getBody(t, cfg, "https://"+addr+"/metrics")
	assert.Regexp(t, `evercert_loopback_selfcheck_total\{result="success"\} [1-9]`, metrics)
	assert.NotContains(t, metrics, `evercert_loopback_selfcheck_total{result="error"}`)
	assert.Regexp(t, `evercert_certificate_rotations_total\{provider="loopback"\} [1-9]`, metrics)

	// The loopback certificate is served only for its SNI name.
	served, err := tlstest.Dial(addr, &tls.Config{ServerName: "apiserver-loopback-client", InsecureSkipVerify: true})
	require.NoError(t, err)
	assert.Equal(t, []string{"apiserver-loopback-client"}, served.DNSNames)
	served, err = tlstest.Dial(addr, &tls.Config{ServerName: "localhost", RootCAs: tlstest.Pool(t, pem)})
	require.NoError(t, err)
	assert.Equal(t, []string{"localhost"}, served.DNSNames)
}

// TestExampleServerFiles serves a default certificate and an SNI certificate
// from files, verifies client certificates against --client-ca-file, and
// follows a rewrite of the default certificate.
func TestExampleServerFiles(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "files-ca", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	issue := func(names ...string) *pki.Issued {
		leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: names[0], DNSNames: names, Now: now, Lifetime: time.Hour})
		require.NoError(t, err)
		return leaf
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	def, other := issue("localhost"), issue("other.test")
	clientCA, err := pki.NewCA(pki.Request{CommonName: "client-ca", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	alice, err := pki.IssueLeaf(clientCA, pki.Request{CommonName: "alice", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)

	addr := startServer(t,
		"--tls-cert-file="+write("tls.crt", def.CertPEM), "--tls-private-key-file="+write("tls.key", def.KeyPEM),
		"--tls-sni-cert-key="+write("other.crt", other.CertPEM)+","+write("other.key", other.KeyPEM)+":other.test,*.other.test",
		"--client-ca-file="+write("client-ca.crt", clientCA.CertPEM),
	)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for name, want := range map[string]*pki.Issued{"localhost": def, "other.test": other} {
		served, err := tlstest.Dial(addr, &tls.Config{RootCAs: roots, ServerName: name})
		require.NoError(t, err, name)
		assert.Equal(t, want.Cert.SerialNumber, served.SerialNumber, name)
	}
	// An explicit name selects the certificate even when the certificate
	// itself does not cover it (the client then rejects it, as it should).
	served, err := tlstest.Dial(addr, &tls.Config{InsecureSkipVerify: true, ServerName: "a.other.test"})
	require.NoError(t, err)
	assert.Equal(t, other.Cert.SerialNumber, served.SerialNumber)
	cert, err := tls.X509KeyPair(alice.CertPEM, alice.KeyPEM)
	require.NoError(t, err)
	getBody(t, &tls.Config{RootCAs: roots, ServerName: "localhost", Certificates: []tls.Certificate{cert}}, "https://"+addr+"/healthz")

	// Rewrite the default pair (key first, then certificate); the new one
	// is served without a restart.
	next := issue("localhost")
	write("tls.key", next.KeyPEM)
	write("tls.crt", next.CertPEM)
	require.Eventually(t, func() bool {
		served, err := tlstest.Dial(addr, &tls.Config{RootCAs: roots, ServerName: "localhost"})
		return err == nil && served.SerialNumber.Cmp(next.Cert.SerialNumber) == 0
	}, 10*time.Second, 20*time.Millisecond)
}

func TestExampleServerRejectsBadFlags(t *testing.T) {
	out, err := exec.Command(proctest.Build(t, "github.com/evercert/evercert/example/server"), "--secure-port=0", "--tls-cert-file=only-cert.pem").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "--tls-private-key-file")
}
