//go:build e2e

package testcluster

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestE2EEtcdOfAnotherClusterIsNotTaken: when another cluster's etcd took
// the client port first, this cluster's etcd fails to bind, but until it
// exits /health on that port answers "true" for the other one. Readiness
// asks the member list for this etcd's own name, so the other etcd is never
// taken for it (and kube-apiserver never writes into another test's etcd).
func TestE2EEtcdOfAnotherClusterIsNotTaken(t *testing.T) {
	other := Start(t)
	// Ours has not exited yet: a process that outlives the wait.
	p, err := startProcess("etcd", "/bin/sleep", []string{"30"}, filepath.Join(t.TempDir(), "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.stop() }()
	c := &Cluster{opts: options{startTimeout: 2 * time.Second}}
	err = c.waitEtcdReady(p, other.EtcdURL(), "testcluster-ours")
	if err == nil || !strings.Contains(err.Error(), "is not this cluster's") {
		t.Fatalf("readiness against another cluster's etcd: got %v, want an error saying it is not this cluster's", err)
	}
	t.Logf("refused: %v", err)
}
