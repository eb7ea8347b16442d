package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/proctest"
)

// TestMain removes the binary the tests build (proctest.Build).
func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }

// cli runs the built evercert binary with args (env added to a minimal
// environment, HOME in a temporary directory so no ~/.kube/config of the
// machine is read) and returns its exit code and combined output.
func cli(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	bin := proctest.Build(t, "github.com/evercert/evercert/cmd/evercert")
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}, env...)
	// A command given --timeout may run that long before it answers, and
	// rotate --wait without it its default; the hang guard comes after.
	guard := proctest.ExitGuard
	if i := slices.Index(args, "--timeout"); i >= 0 && i+1 < len(args) {
		d, err := time.ParseDuration(args[i+1])
		require.NoError(t, err, "--timeout %q", args[i+1])
		guard += d
	} else if slices.Contains(args, "--wait") {
		guard += defaultRotateTimeout
	}
	code, out := proctest.RunToExitWithin(t, cmd, guard)
	t.Logf("evercert %s: exit %d\n%s", strings.Join(args, " "), code, out)
	return code, out
}

// TestUsageExitCodes runs the binary with bad usage: each exits 2 with a
// message naming the problem, before any API call (no cluster is needed:
// the kubeconfig points nowhere). --help exits 0.
func TestUsageExitCodes(t *testing.T) {
	env := []string{"KUBECONFIG=/nonexistent/kubeconfig"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"status"}, "takes 1 argument(s), got 0"},
		{[]string{"status", "ca", "--output", "yaml"}, `--output "yaml": want text or json`},
		{[]string{"status", "ca", "--webhook", "ca/x"}, `--webhook "ca/x": want validating/NAME or mutating/NAME`},
		{[]string{"status", "ca", "--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"rotate", "ca", "--compromised"}, "--compromised requires a non-empty --reason"},
		{[]string{"rotate", "ca", "--compromised", "--reason", "  "}, "--compromised requires a non-empty --reason"},
		{[]string{"rotate", "ca", "--reason", "leaked"}, "--reason and --ca go with --compromised"},
		{[]string{"check", "127.0.0.1:1"}, "give exactly one of --webhook, --cluster-trust-bundle and --ca-file"},
		{[]string{"check", "127.0.0.1:1", "--ca-file", "a", "--webhook", "validating/x"}, "give exactly one of"},
		{[]string{"check", "no-port", "--ca-file", "a"}, `address "no-port": want host:port`},
	} {
		code, out := cli(t, env, c.args...)
		assert.Equal(t, exitUsage, code, "evercert %v: exit code", c.args)
		assert.Contains(t, out, c.want, "evercert %v: message", c.args)
	}
	code, out := cli(t, env, "rotate", "--help")
	assert.Equal(t, exitOK, code, "rotate --help")
	assert.Contains(t, out, "--compromised")

	// An API-side failure (no kubeconfig) is exit 1, naming the cause.
	code, out = cli(t, env, "status", "ca")
	assert.Equal(t, exitError, code, "status without a reachable kubeconfig")
	assert.Contains(t, out, "kubeconfig")
}

// TestProgramName: as a kubectl plugin the usage text says "kubectl
// evercert".
func TestProgramName(t *testing.T) {
	assert.Equal(t, "kubectl evercert", programName("/usr/local/bin/kubectl-evercert"))
	assert.Equal(t, "evercert", programName("/go/bin/evercert"))
}
