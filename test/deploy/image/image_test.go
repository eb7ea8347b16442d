package image

import (
	"context"
	"strings"
	"testing"
)

// TestBuildAllRefusesBinaryNameClash: one go build writes each binary into
// one directory under the last element of its package path, so two
// examples whose packages end alike would overwrite each other's binary and
// one image would silently hold the other's program. BuildAll refuses them
// before it builds anything.
func TestBuildAllRefusesBinaryNameClash(t *testing.T) {
	es := []Example{
		{Name: "server", Package: "./example/server"},
		{Name: "other", Package: "./other/server"},
	}
	_, err := BuildAll(context.Background(), es, Options{RepoRoot: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), `build binaries of the same name "server"`) {
		t.Fatalf("BuildAll of two packages named server: got %v, want the clash refused", err)
	}
}
