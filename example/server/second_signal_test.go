package main

import (
	"crypto/tls"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/tlstest"
)

// TestExampleServerSecondSignalExits: with a long --shutdown-timeout and a
// connection that holds the graceful shutdown (an HTTP/2 request whose
// response the client never lets through), a second SIGTERM (or Ctrl-C)
// must end the process at once, exit status 1, as Kubernetes servers do.
// It was ignored: the process waited out the whole timeout.
func TestExampleServerSecondSignalExits(t *testing.T) {
	bundle := filepath.Join(t.TempDir(), "ca.crt")
	bin := proctest.Build(t, "github.com/evercert/evercert/example/server")
	var out proctest.LockedBuffer
	cmd := exec.Command(bin, "--secure-port=0", "--loopback-selfcheck-interval=0", "--ca-bundle-file="+bundle, "--shutdown-timeout=1h")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("output:\n%s", out.String())
		}
	})
	var addr string
	require.Eventually(t, func() bool {
		m := servingLine.FindStringSubmatch(out.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	}, proctest.ExitGuard, 10*time.Millisecond, "serving")
	pem, err := os.ReadFile(bundle)
	require.NoError(t, err)
	stalled, err := tlstest.StalledHTTP2Request(addr, &tls.Config{RootCAs: tlstest.Pool(t, pem), ServerName: "localhost"}, "/healthz")
	require.NoError(t, err)
	defer stalled.Close()

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "Shutting down") }, proctest.ExitGuard, 10*time.Millisecond, "the graceful shutdown to start")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "exit: %v", err)
		assert.Equal(t, 1, ee.ExitCode(), "exit code after the second signal")
	case <-time.After(proctest.ExitGuard):
		t.Fatalf("still running %v after a second SIGTERM (--shutdown-timeout=1h)", proctest.ExitGuard)
	}
}
