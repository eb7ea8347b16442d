//go:build e2e

package e2e

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/healthz"

	evercert "github.com/evercert/evercert/controllerruntime"
)

// TestProbeNamesWithheldReason: a replica's /readyz (controller-runtime's
// aggregate) withholds a failed check's error, so the probe's record of
// the last failure, which the readiness wait's failure message prints,
// carries the error from the check's own path.
func TestProbeNamesWithheldReason(t *testing.T) {
	const why = "CA 1234 reached this replica's bundle less than the propagation delay ago"
	h := &healthz.Handler{Checks: map[string]healthz.Checker{
		"readyz":           healthz.Ping,
		evercert.CheckName: func(*http.Request) error { return errors.New(why) },
	}}
	// As controller-runtime's manager serves its readiness handler.
	mux := http.NewServeMux()
	mux.Handle("/readyz", http.StripPrefix("/readyz", h))
	mux.Handle("/readyz/", http.StripPrefix("/readyz", h))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	r := &replica{backend: &backend{name: "replica-0"}, probePort: ln.Addr().(*net.TCPAddr).Port}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.probe(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	for r.lastNotReady() == "" {
		time.Sleep(20 * time.Millisecond)
	}
	if got := r.lastNotReady(); !strings.Contains(got, why) {
		t.Fatalf("the last failed probe does not say why: %q", got)
	}
	// TestE2EOperatorSteadyState asserts none of these in its window.
	if r.refusals.Load() == 0 {
		t.Fatal("a /readyz answer naming a failed check is not counted in refusals")
	}
}

// TestProbeExitedReplicaNotRoutable: a replica whose process has exited is
// not routable, although its probe port answers /readyz for another
// process that took it (one a replica lost before binding it, or one a
// killed replica left), as the kubelet takes a pod whose container exited
// out of its Service at once.
func TestProbeExitedReplicaNotRoutable(t *testing.T) {
	impostor := http.NewServeMux()
	impostor.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: impostor, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	// /bin/true stands in for an operator that exits at once: it ignores
	// the flags start passes.
	r := newReplica(t, "/bin/true", "replica-0", freePorts(t, 3))
	r.portMu.Lock()
	r.probePort = ln.Addr().(*net.TCPAddr).Port
	r.portMu.Unlock()
	r.start(t)
	<-r.last.gone
	r.mu.Lock()
	r.cmd = nil // gone before the test stopped it: nothing for Cleanup to stop
	r.mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.probe(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for !r.routable.Load() && !strings.Contains(r.lastNotReady(), "exited") {
		time.Sleep(20 * time.Millisecond)
	}
	if r.routable.Load() {
		t.Fatalf("replica %s is routable after its process exited: its probe port answered for another process", r.name)
	}
}
