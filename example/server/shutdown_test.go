package main

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/tlstest"
)

// shutdownWarning is the line Serve logs when --shutdown-timeout cut
// connections.
var shutdownWarning = regexp.MustCompile(`Warning: connections still open after --shutdown-timeout were closed.* count=(\d+) connections=\[(.*)\]`)

// TestExampleServerShutdownCutsStalledConnections opens, before SIGTERM,
// the connections that can hold a graceful shutdown past its timeout: an
// HTTP/2 request whose response the client never lets through (window 0:
// active for as long as the connection lives) and a TCP connection that
// sent half a ClientHello (new). The server closes what is still open at
// --shutdown-timeout, logs a warning naming the HTTP/2 connection, and
// exits 0. Before, it logged "Server failed" err="shutting down: context
// deadline exceeded" and exited 1.
func TestExampleServerShutdownCutsStalledConnections(t *testing.T) {
	bundle := filepath.Join(t.TempDir(), "ca.crt")
	bin := proctest.Build(t, "github.com/evercert/evercert/example/server")
	p, addr := proctest.Start(t, bin, servingLine, "--secure-port=0", "--loopback-selfcheck-interval=0",
		"--ca-bundle-file="+bundle, "--shutdown-timeout=300ms")
	pem, err := os.ReadFile(bundle)
	require.NoError(t, err)

	half, err := tlstest.PartialClientHello(addr)
	require.NoError(t, err)
	defer half.Close()
	// Accepted after half (the accept queue is FIFO) and answered: both
	// connections are the server's when the signal arrives.
	stalled, err := tlstest.StalledHTTP2Request(addr, &tls.Config{RootCAs: tlstest.Pool(t, pem), ServerName: "localhost"}, "/healthz")
	require.NoError(t, err)
	defer stalled.Close()

	code := p.Terminate(t)
	out := p.Output()
	assert.Zero(t, code, "exit code after SIGTERM with connections to cut:\n%s", out)
	assert.NotContains(t, out, "Server failed")
	m := shutdownWarning.FindStringSubmatch(out)
	require.NotNil(t, m, "no warning naming the connections that were cut:\n%s", out)
	assert.Contains(t, m[2], stalled.LocalAddr().String()+" (active, h2 for ", "the warning names the stalled HTTP/2 connection and its state")
	// The half handshake is cut too unless it was already 5 s old when
	// Shutdown looked at it (net/http then closes it as idle): not asserted.
	t.Logf("cut %s connection(s): %s (half ClientHello from %s)", m[1], m[2], half.LocalAddr())
}
