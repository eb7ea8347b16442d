package main

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"

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
