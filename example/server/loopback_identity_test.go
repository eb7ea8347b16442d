package main

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// TestExampleServerLoopbackNeverDefault runs the example server with only
// --tls-sni-cert-key, the field-trial reproduction: clients that send no
// SNI, an unknown name or an IP literal must get the user's certificate,
// never the internal apiserver-loopback-client identity.
func TestExampleServerLoopbackNeverDefault(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "user-ca", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "user.test", DNSNames: []string{"user.test"}, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "user.crt"), filepath.Join(dir, "user.key")
	require.NoError(t, os.WriteFile(certFile, leaf.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile, leaf.KeyPEM, 0o600))

	addr := startServer(t, "--tls-sni-cert-key="+certFile+","+keyFile)
	for _, name := range []string{"", "unknown.test", "user.test"} {
		served, err := tlstest.Dial(addr, &tls.Config{ServerName: name, InsecureSkipVerify: true})
		require.NoError(t, err, "server name %q", name)
		assert.Equal(t, leaf.Cert.SerialNumber, served.SerialNumber,
			"server name %q got %q issued by %q, want the user's certificate", name, served.Subject.CommonName, served.Issuer.CommonName)
	}
	served, err := tlstest.Dial(addr, &tls.Config{ServerName: "apiserver-loopback-client", InsecureSkipVerify: true})
	require.NoError(t, err)
	assert.Equal(t, []string{"apiserver-loopback-client"}, served.DNSNames, "the loopback name still gets the loopback certificate")
}
