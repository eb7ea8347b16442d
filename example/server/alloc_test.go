//go:build !race

// The race detector allocates, so this file is left out of -race builds;
// make test-alloc runs it without -race.

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/example/server/app"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/tlstest"
)

// TestPerConnectionAllocationsMatchStatic: a TLS connection to the example
// server costs no more allocations than one to the same net/http server on
// a static tls.Config with the same certificate: the server does nothing
// per connection beyond the handshake and HTTP's own set-up (no log line,
// no metric, no connection hook). Both servers run in this process, and
// the client's allocations, the same for both, are counted too. The
// tolerance, 1.5 allocations, covers the ClientHelloInfo crypto/tls makes
// to call GetConfigForClient; a disabled klog.V(2) line per connection
// already costs two.
func TestPerConnectionAllocationsMatchStatic(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "alloc-ca", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "localhost", DNSNames: []string{"localhost"}, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certFile, leaf.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile, leaf.KeyPEM, 0o600))

	// The example server, as main runs it, without the self-check, whose
	// requests would be counted.
	opts := app.NewOptions()
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	opts.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--secure-port=0", "--tls-cert-file=" + certFile,
		"--tls-private-key-file=" + keyFile, "--loopback-selfcheck-interval=0"}))
	ctx, cancel := context.WithCancel(context.Background())
	var out proctest.LockedBuffer
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, opts, &out) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("the example server did not stop")
		}
	})
	banner := regexp.MustCompile(`listening on https://localhost:([0-9]+)/`)
	var port string
	require.Eventually(t, func() bool {
		m := banner.FindStringSubmatch(out.String())
		if m != nil {
			port = m[1]
		}
		return m != nil
	}, time.Minute, 10*time.Millisecond, "the example server did not start")
	evercert := net.JoinHostPort("127.0.0.1", port)

	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	static := &http.Server{
		Handler:           http.NotFoundHandler(),
		ReadHeaderTimeout: 32 * time.Second,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}, Certificates: []tls.Certificate{pair}},
	}
	served := make(chan error, 1)
	go func() { served <- static.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		_ = static.Close()
		<-served
	})

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	client := &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2", "http/1.1"}, SessionTicketsDisabled: true}
	perConn := func(addr string) (allocs, bytes float64) {
		const n = 1000
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range n {
			_, err := tlstest.Exchange(addr, client)
			require.NoError(t, err)
		}
		runtime.ReadMemStats(&after)
		return float64(after.Mallocs-before.Mallocs) / n, float64(after.TotalAlloc-before.TotalAlloc) / n
	}
	for _, addr := range []string{evercert, ln.Addr().String()} {
		perConn(addr) // warm up: ticket keys, HTTP/2 server, buffers
	}
	// The smallest of three rounds, interleaved, so that a GC or a timer
	// firing during one round does not count.
	minAllocs, minBytes := map[string]float64{}, map[string]float64{}
	for range 3 {
		for name, addr := range map[string]string{"evercert": evercert, "static": ln.Addr().String()} {
			allocs, bytes := perConn(addr)
			if cur, ok := minAllocs[name]; !ok || allocs < cur {
				minAllocs[name] = allocs
			}
			if cur, ok := minBytes[name]; !ok || bytes < cur {
				minBytes[name] = bytes
			}
		}
	}
	t.Logf("per connection (client and server): evercert %.1f allocs, %.0f B; static %.1f allocs, %.0f B",
		minAllocs["evercert"], minBytes["evercert"], minAllocs["static"], minBytes["static"])
	assert.LessOrEqual(t, minAllocs["evercert"], minAllocs["static"]+1.5, "allocations per connection")
	assert.LessOrEqual(t, minBytes["evercert"], minBytes["static"]+512, "bytes allocated per connection")
}
