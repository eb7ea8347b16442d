//go:build e2e

package e2e

import (
	"os"
	"testing"

	"github.com/evercert/evercert/internal/proctest"
)

// Each test runs its own kube-apiserver and etcd, and most wait on real
// rotations more than they compute, so most call t.Parallel and overlap,
// two at a time (make test-e2e passes -parallel 2). Two kinds stay
// sequential, and Go runs them first, one at a time:
//   - a test that compares a metric before and after: evercert's metrics
//     are process-global (the Authorities, publishers and signers run in
//     this process), and another test's providers would count into the
//     same series;
//   - a test whose lifetimes are a few seconds on the real clock and that
//     asserts no failed handshake or request (TestE2EAuthorityReplicas:
//     4 s leaves; TestE2EAggregation: 4 s validity): sharing the CPU with
//     another cluster under -race would make a starved replica serving an
//     expired leaf likelier, which is the machine's speed, not evercert's.

// TestMain removes the binaries the tests build (proctest.Build).
func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }
