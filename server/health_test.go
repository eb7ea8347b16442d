package server

import (
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// TestServingCertificateCheckNotOnLivez serves a default certificate and an
// SNI certificate from files, then lets the SNI one expire on the fake
// clock: /readyz and /healthz fail naming its provider, /livez stays 200
// because a restart would only load the same expired file again.
func TestServingCertificateCheckNotOnLivez(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	clk := clocktesting.NewFakeClock(now)
	ca, err := pki.NewCA(pki.Request{CommonName: "health-ca", Now: now, Lifetime: 48 * time.Hour})
	require.NoError(t, err)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	def, err := pki.IssueLeaf(ca, pki.Request{CommonName: "localhost", DNSNames: []string{"localhost"}, Now: now, Lifetime: 48 * time.Hour})
	require.NoError(t, err)
	short, err := pki.IssueLeaf(ca, pki.Request{CommonName: "short.test", DNSNames: []string{"short.test"}, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)

	o := NewOptions()
	o.Clock = clk
	o.CertFile, o.KeyFile = write("tls.crt", def.CertPEM), write("tls.key", def.KeyPEM)
	sniCert, sniKey := write("short.crt", short.CertPEM), write("short.key", short.KeyPEM)
	_, err = parseInto(o, "--tls-sni-cert-key="+sniCert+","+sniKey)
	require.NoError(t, err)
	r := start(t, o, nil)
	// Health endpoints are read by probes that do not verify the server.
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"},
	}}

	for _, path := range []string{"/livez", "/readyz", "/healthz"} {
		code, body, _ := get(t, c, "https://"+r.addr+path+"?verbose")
		require.Equal(t, http.StatusOK, code, "%s before expiry: %s", path, body)
	}

	clk.Step(2 * time.Hour)
	provider := "sni-serving-cert::" + sniCert + "::" + sniKey
	for _, path := range []string{"/readyz", "/healthz"} {
		code, body, _ := get(t, c, "https://"+r.addr+path+"?verbose")
		assert.Equal(t, http.StatusInternalServerError, code, path)
		assert.Contains(t, body, "[-]serving-certificate failed", path)
		code, body, _ = get(t, c, "https://"+r.addr+path+"/serving-certificate")
		assert.Equal(t, http.StatusInternalServerError, code, path)
		assert.Contains(t, body, provider, "%s names the expired provider", path)
	}
	code, body, _ := get(t, c, "https://"+r.addr+"/livez?verbose")
	assert.Equal(t, http.StatusOK, code, "/livez must not fail on an expired certificate a restart cannot fix: %s", body)
	assert.NotContains(t, body, "serving-certificate")
	code, _, _ = get(t, c, "https://"+r.addr+"/livez/serving-certificate")
	assert.Equal(t, http.StatusNotFound, code, "no serving-certificate check under /livez")
}
