package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/proctest"
)

// TestSignerBadFlagsExit: the binary refuses bad flags at start, exit code
// 2, naming each flag, before it opens a listener or calls the API server.
// TestMain removes the binaries the tests build (proctest.Build).
func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }

func TestSignerBadFlagsExit(t *testing.T) {
	bin := proctest.Build(t, "github.com/evercert/evercert/example/signer")
	for name, tc := range map[string]struct {
		args []string
		want []string
	}{
		"nothing given":   {args: nil, want: []string{"--ca-secret: required", "--policy: required"}},
		"bad policy file": {args: []string{"--ca-secret=ns/ca", "--policy=/nonexistent/policy.yaml"}, want: []string{"--policy: open /nonexistent/policy.yaml"}},
		"reserved signer": {args: []string{"--ca-secret=ns/ca", "--policy=policy.yaml", "--signer-name=kubernetes.io/x"}, want: []string{"--signer-name", "reserved"}},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := proctest.RunToExit(t, exec.Command(bin, tc.args...))
			assert.Equal(t, 2, code, out)
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
			assert.NotContains(t, out, "serving on https://")
		})
	}
}

// TestSignerRefusesCAThatNeverCoversAnHour: a CA schedule whose CAs can
// never give a leaf the API's minimum of one hour (here 30 minutes, renewed
// 10 minutes before expiry) is refused at start, exit code 2, naming the
// flags and the numbers, before a listener opens or the API server is
// called (the kubeconfig points nowhere).
func TestSignerRefusesCAThatNeverCoversAnHour(t *testing.T) {
	bin := proctest.Build(t, "github.com/evercert/evercert/example/signer")
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	code, out := proctest.RunToExit(t, exec.Command(bin, "--kubeconfig="+kubeconfig, "--ca-secret=ns/ca", "--policy=policy.yaml", "--secure-port=0",
		"--self-signed-validity=6m", "--ca-validity=30m", "--ca-renew-before=10m"))
	assert.Equal(t, 2, code, out)
	for _, w := range []string{"--ca-validity 30m0s", "--ca-renew-before 10m0s", "--ca-propagation-delay 2m0s",
		"can never cover the API's minimum leaf lifetime", "leaves at most 29m59s"} {
		assert.Contains(t, out, w)
	}
	assert.NotContains(t, out, "serving on https://")
	assert.NotContains(t, out, "ready")
}
