package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/proctest"
)

// exitGuard is how long a process that should fail at start-up may run
// before the test gives up: generous, it guards against a hang.
const exitGuard = 30 * time.Second

// runToExit runs bin with args and returns its exit code and combined
// output. A process still running after exitGuard is killed by pid and the
// test fails.
func runToExit(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), out.String()
		}
		require.NoError(t, err)
		return 0, out.String()
	case <-time.After(exitGuard):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("%s %v still running %v after start (killed); output:\n%s", bin, args, exitGuard, out.String())
		return 0, ""
	}
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
