package server

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/tlstest"
)

// TestServeKeyAndChainInOneFile serves files that hold a key and its chain
// together, as the kubelet's podCertificate projection writes them:
// --tls-cert-file and --tls-private-key-file naming the same file (key
// first), and --tls-sni-cert-key f,f (key last). Clients that trust only the
// root receive the intermediate and verify. A rewrite whose chain is out of
// order is refused and counted, and the last good chain keeps serving.
func TestServeKeyAndChainInOneFile(t *testing.T) {
	dir := t.TempDir()
	chain, err := tlstest.NewChain(time.Now(), "pod")
	require.NoError(t, err)
	issue := func(host string) *tlstest.Leaf {
		leaf, err := chain.Issue(time.Now(), time.Hour, host)
		require.NoError(t, err)
		return leaf
	}
	// rename-over, so the watch never sees a partial file.
	write := func(name string, parts ...[]byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path+".tmp", bytes.Join(parts, nil), 0o600))
		require.NoError(t, os.Rename(path+".tmp", path))
		return path
	}
	def, alt := issue("localhost"), issue("alt.test")
	defFile := write("credentialbundle.pem", def.KeyPEM, def.CertPEM)
	altFile := write("alt.pem", alt.CertPEM, alt.KeyPEM)

	o, err := parseInto(NewOptions(), "--tls-cert-file="+defFile, "--tls-private-key-file="+defFile,
		"--tls-sni-cert-key="+altFile+","+altFile)
	require.NoError(t, err)
	r := start(t, o, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))

	serves := func(serverName string, want *tlstest.Leaf) {
		t.Helper()
		c := client(chain.RootPool(), nil)
		c.Transport.(*http.Transport).TLSClientConfig.ServerName = serverName
		code, _, resp := get(t, c, "https://"+r.addr+"/")
		require.Equal(t, http.StatusOK, code)
		peer := resp.TLS.PeerCertificates
		require.Len(t, peer, 2, "leaf and intermediate are sent")
		assert.Equal(t, 0, peer[0].SerialNumber.Cmp(want.Cert.SerialNumber), "%s: serial", serverName)
		assert.Equal(t, chain.Intermediate.Raw, peer[1].Raw)
		require.Len(t, resp.TLS.VerifiedChains, 1)
		assert.Len(t, resp.TLS.VerifiedChains[0], 3, "verified up to the root")
	}
	serves("localhost", def)
	serves("alt.test", alt)

	errs := certmetricstest.LoadErrors(t, "serving-cert")
	next := issue("localhost")
	leafOnly := next.CertPEM[:bytes.Index(next.CertPEM, chain.IntermediatePEM)]
	write("credentialbundle.pem", next.KeyPEM, leafOnly, chain.RootPEM)
	require.Eventually(t, func() bool { return certmetricstest.LoadErrors(t, "serving-cert") > errs },
		10*time.Second, 10*time.Millisecond, "the broken chain is counted")
	serves("localhost", def)

	write("credentialbundle.pem", next.KeyPEM, next.CertPEM)
	require.Eventually(t, func() bool {
		for _, sc := range r.serving.Controller.Served() {
			if sc.IsDefault {
				return sc.Serial == next.Cert.SerialNumber.Text(16)
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	serves("localhost", next)
	serves("alt.test", alt)
}
