package main

import (
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/proctest"
)

var loadedLine = regexp.MustCompile(`"Loaded certificate" provider="([^"]+)".* notAfter="([^"]+)"`)

// leavesPerNotAfter counts, per provider, the leaves logged as loaded for
// each NotAfter (whole seconds, as X.509 stores it).
func leavesPerNotAfter(out string) map[string]map[string]int {
	per := map[string]map[string]int{}
	for _, m := range loadedLine.FindAllStringSubmatch(out, -1) {
		if per[m[1]] == nil {
			per[m[1]] = map[string]int{}
		}
		per[m[1]][m[2]]++
	}
	return per
}

// TestExampleServerOneSecondValiditiesDoNotSpin: with
// --self-signed-validity=1s or --loopback-validity=1s (the loopback's
// minimum) the leaf was due the moment it was issued, and the server
// re-issued it at once, forever: 4,414 rotations in 6 s, 8,133 re-issues
// and 2.5 MB of log in 8 s. The certificates themselves are the clock here:
// a 1s leaf's NotAfter is the next whole second after a second from now,
// so at most two leaves per MinReissueInterval of 500ms share it, plus a
// leaf cut short by its CA's end and its successor from the next CA; the
// old loop issued hundreds per NotAfter. No wall-clock threshold: a slow
// machine only issues fewer.
func TestExampleServerOneSecondValiditiesDoNotSpin(t *testing.T) {
	bin := proctest.Build(t, "github.com/evercert/evercert/example/server")
	p, _ := proctest.Start(t, bin, servingLine, "--secure-port=0", "--self-signed-validity=1s", "--loopback-validity=1s")

	// Let each provider go through a few CA rotations (3s CAs).
	const rotations = 8
	deadline := time.Now().Add(2 * time.Minute)
	for {
		per := leavesPerNotAfter(p.Output())
		if len(per["self-signed"]) > rotations && len(per["loopback"]) > rotations {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d distinct NotAfters per provider after 2 minutes: %v", rotations, per)
		}
		time.Sleep(100 * time.Millisecond)
	}
	per := leavesPerNotAfter(p.Output())
	for _, provider := range []string{"self-signed", "loopback"} {
		most, total := 0, 0
		for notAfter, n := range per[provider] {
			assert.LessOrEqual(t, n, 4, "%s leaves with NotAfter %s", provider, notAfter)
			most, total = max(most, n), total+n
		}
		t.Logf("%s: %d leaves for %d NotAfters, at most %d per NotAfter", provider, total, len(per[provider]), most)
	}
}

// TestExampleServerSubSecondSelfSignedValidityExits: a validity X.509
// cannot express is refused at start, naming the flag, as
// --loopback-validity already was.
func TestExampleServerSubSecondSelfSignedValidityExits(t *testing.T) {
	code, out := runToExit(t, proctest.Build(t, "github.com/evercert/evercert/example/server"), "--secure-port=0", "--self-signed-validity=999ms")
	require.NotZero(t, code, out)
	assert.Contains(t, out, "--self-signed-validity: 999ms must be at least 1s")
	assert.NotContains(t, out, "serving on https://")
}
