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
}
