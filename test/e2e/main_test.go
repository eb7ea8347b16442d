//go:build e2e

package e2e

import (
	"os"
	"testing"

	"github.com/evercert/evercert/internal/proctest"
)

// Each test runs its own kube-apiserver and etcd, and most wait on real
// rotations more than they compute, so the tests that read no
// process-global metric call t.Parallel and overlap (two at a time on two
// cores). A test that compares a metric before and after (evercert's
// metrics are process-global: the Authorities, publishers and signers run
// in this process) does not: another test's providers would count into
// the same series. Go runs those first, one at a time, and the parallel
// ones after them.

// TestMain removes the binaries the tests build (proctest.Build).
func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }
