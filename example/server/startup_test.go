package main

import (
	"crypto/tls"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/proctest"
)

// runToExit runs bin with args until it exits (internal/proctest).
func runToExit(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	return proctest.RunToExit(t, exec.Command(bin, args...))
}

// TestExampleServerPortInUseExits: a port in use is a start-up error: the
// server exits non-zero, naming the address.
func TestExampleServerPortInUseExits(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	port := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)

	code, out := runToExit(t, proctest.Build(t, "github.com/evercert/evercert/example/server"), "--secure-port="+port)
	assert.NotZero(t, code, out)
	assert.Contains(t, out, "127.0.0.1:"+port, "the error names the address")
	assert.Contains(t, out, "address already in use")
}

// TestExampleServerHTTP2IncompatibleSuitesExit: a suite list HTTP/2 cannot
// use is refused at start, naming the flag, instead of serving nothing.
func TestExampleServerHTTP2IncompatibleSuitesExit(t *testing.T) {
	code, out := runToExit(t, proctest.Build(t, "github.com/evercert/evercert/example/server"),
		"--secure-port=0", "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA")
	assert.NotZero(t, code, out)
	assert.Contains(t, out, "--tls-cipher-suites")
	assert.Contains(t, out, "HTTP/2")
	assert.NotContains(t, out, "serving on https://", "no listener was opened")
}

// TestExampleServerHelpOffersNoInsecureSuite: --help lists no suite that
// is always refused.
func TestExampleServerHelpOffersNoInsecureSuite(t *testing.T) {
	code, out := runToExit(t, proctest.Build(t, "github.com/evercert/evercert/example/server"), "--help")
	assert.Zero(t, code, out)
	require.Contains(t, out, "--tls-cipher-suites")
	assert.Contains(t, out, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")
	var offered []string
	for _, s := range tls.InsecureCipherSuites() {
		if regexp.MustCompile(`\b` + regexp.QuoteMeta(s.Name) + `\b`).MatchString(out) {
			offered = append(offered, s.Name)
		}
	}
	assert.Empty(t, offered, "--help offers suites Validate always refuses")
	assert.NotContains(t, out, "RC4")
	assert.NotContains(t, out, "3DES")
}

// TestExampleServerRefusesUnloadableClientCA: a --client-ca-file that is
// missing, a directory or not a CA bundle is a start-up error naming the
// flag and the file: the server exits non-zero without listening, instead
// of starting and reporting ready while every client certificate fails.
func TestExampleServerRefusesUnloadableClientCA(t *testing.T) {
	bin := proctest.Build(t, "github.com/evercert/evercert/example/server")
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.crt")
	require.NoError(t, os.WriteFile(garbage, []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"), 0o600))
	for name, path := range map[string]string{
		"missing":   filepath.Join(dir, "missing.crt"),
		"directory": dir,
		"garbage":   garbage,
	} {
		t.Run(name, func(t *testing.T) {
			code, out := runToExit(t, bin, "--secure-port=0", "--client-ca-file="+path)
			assert.NotZero(t, code, out)
			assert.Regexp(t, `Server failed.*--client-ca-file: .*`+regexp.QuoteMeta(path), out, "the error names the flag and the file")
			assert.NotContains(t, out, "serving on https://", "no listener was opened")
		})
	}
}
