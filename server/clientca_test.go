package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
)

// clientCAProvider is the provider name --client-ca-file reports under, in
// logs and in evercert_certificate_load_errors_total.
const clientCAProvider = "client-ca-bundle"

// TestClientCAFileBreaksLater serves with --client-ca-file through Serve,
// whose file watch loop follows the file, then breaks the file three ways
// (garbage, empty, deleted). Each break is counted in
// evercert_certificate_load_errors_total{provider="client-ca-bundle"}, and
// after each one a client certificate from the last good CA still
// verifies in a real mTLS handshake on 127.0.0.1; the client-ca readiness
// check is on /readyz and stays ok, since the last good CA keeps
// verifying. Once every CA of the bundle has expired on the fake clock,
// client-ca fails, naming the provider.
func TestClientCAFileBreaksLater(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	clk := clocktesting.NewFakeClock(now)
	ca, err := pki.NewCA(pki.Request{CommonName: "serving-ca", Now: now, Lifetime: 48 * time.Hour})
	require.NoError(t, err)
	def, err := pki.IssueLeaf(ca, pki.Request{CommonName: "localhost", DNSNames: []string{"localhost"}, Now: now, Lifetime: 48 * time.Hour})
	require.NoError(t, err)
	clientCA, err := pki.NewCA(pki.Request{CommonName: "client-ca", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	alice, err := pki.IssueLeaf(clientCA, pki.Request{CommonName: "alice", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}

	o := NewOptions()
	o.Clock = clk
	o.CertFile, o.KeyFile = write("tls.crt", def.CertPEM), write("tls.key", def.KeyPEM)
	o.ClientCAFile = write("client-ca.crt", clientCA.CertPEM)
	r := start(t, o, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// Only a chain verified against the client CA bundle counts.
		if len(req.TLS.VerifiedChains) > 0 {
			_, _ = io.WriteString(w, "verified "+req.TLS.VerifiedChains[0][0].Subject.CommonName)
		}
	}))

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	pair, err := tls.X509KeyPair(alice.CertPEM, alice.KeyPEM)
	require.NoError(t, err)
	// A new connection, so a new handshake, for every request.
	mtls := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "localhost", Time: clk.Now,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }},
	}}
	requireVerified := func(when string) {
		t.Helper()
		code, body, resp := get(t, mtls, "https://"+r.addr+"/whoami")
		require.Equal(t, http.StatusOK, code, when)
		require.NotNil(t, resp.TLS, when)
		require.True(t, resp.TLS.HandshakeComplete, when)
		assert.Equal(t, "verified alice", body, "%s: a client certificate from the last good CA verifies", when)
		code, body, _ = get(t, mtls, "https://"+r.addr+"/readyz?verbose")
		assert.Equal(t, http.StatusOK, code, "%s: /readyz: %s", when, body)
		assert.Contains(t, body, "[+]client-ca ok", "%s: /readyz", when)
	}
	requireVerified("before any break")

	breaks := []struct {
		name  string
		apply func(path string) error
	}{
		{"rewritten with garbage", func(p string) error { return os.WriteFile(p, []byte("not a PEM bundle\n"), 0o600) }},
		{"emptied", func(p string) error { return os.WriteFile(p, nil, 0o600) }},
		{"deleted", os.Remove},
	}
	for _, b := range breaks {
		before := certmetricstest.LoadErrors(t, clientCAProvider)
		require.NoError(t, b.apply(o.ClientCAFile))
		// The watch loop reads the file on the event and reports the
		// failure once it outlasts the settle grace.
		require.Eventually(t, func() bool { return certmetricstest.LoadErrors(t, clientCAProvider) > before },
			30*time.Second, 10*time.Millisecond, "%s: the failure is counted in evercert_certificate_load_errors_total{provider=%q}", b.name, clientCAProvider)
		assert.Equal(t, before+1, certmetricstest.LoadErrors(t, clientCAProvider), "%s: counted once", b.name)
		requireVerified("after the file was " + b.name)
	}
	failing, ok := r.serving.ClientCA.(interface{ LastError() error })
	require.True(t, ok, "the --client-ca-file provider reports its last failure")
	require.ErrorContains(t, failing.LastError(), o.ClientCAFile, "the failure names the file")

	// The bundle's only CA expires (the serving certificate does not):
	// client-ca fails, naming the provider; serving-certificate does not.
	// alice has expired too, on the server's clock, which verifies client
	// certificates: she is refused, and the probe goes without a
	// certificate (VerifyClientCertIfGiven).
	clk.Step(2 * time.Hour)
	_, err = mtls.Get("https://" + r.addr + "/whoami")
	require.Error(t, err, "a client certificate expired on the server's clock must be refused")
	probe := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "localhost", Time: clk.Now},
	}}
	code, body, _ := get(t, probe, "https://"+r.addr+"/readyz?verbose")
	assert.Equal(t, http.StatusInternalServerError, code, body)
	assert.Contains(t, body, "[-]client-ca failed")
	assert.Contains(t, body, "[+]serving-certificate ok")
	code, body, _ = get(t, probe, "https://"+r.addr+"/readyz/client-ca")
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.Contains(t, body, "every client CA of client-ca-bundle has expired")
}

// TestClientCAFileMustLoadAtStart: Serve refuses to start, naming the flag
// and the file, when --client-ca-file is missing, a directory or not a CA
// bundle, and opens no listener.
func TestClientCAFileMustLoadAtStart(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.crt")
	require.NoError(t, os.WriteFile(garbage, []byte("not a PEM bundle\n"), 0o600))
	for name, path := range map[string]string{
		"missing":   filepath.Join(dir, "missing.crt"),
		"directory": dir,
		"garbage":   garbage,
	} {
		t.Run(name, func(t *testing.T) {
			o := NewOptions()
			o.SecurePort = 0
			o.ClientCAFile = path
			s, err := o.Build()
			require.NoError(t, err)
			// Should it listen, stop it at once: the test then fails
			// instead of serving until it times out.
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go func() {
				select {
				case <-s.Listening():
					cancel()
				case <-ctx.Done():
				}
			}()
			err = s.Serve(ctx, http.NotFoundHandler())
			require.Error(t, err, "Serve started with an unloadable --client-ca-file")
			assert.Contains(t, err.Error(), "--client-ca-file: ")
			assert.Contains(t, err.Error(), path)
			assert.Nil(t, s.Addr(), "no listener was opened")
		})
	}
}
