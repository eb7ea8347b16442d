// Package klogtest captures what klog logs during a test, at the default
// verbosity, that is what an operator sees without -v.
package klogtest

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// Logs is what klog logged since Capture, one slog text record per line
// (msg="..." key=value ... level=INFO or level=ERROR). It is safe for
// concurrent use.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Capture sends klog's output to the returned Logs until the test ends.
// klog is global: tests that use it must not be parallel.
func Capture(t testing.TB) *Logs {
	t.Helper()
	l := &Logs{}
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(l, nil)))
	t.Cleanup(klog.ClearLogger)
	return l
}

// Write implements io.Writer for the slog handler.
func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything logged so far.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Lines returns the logged lines that contain every one of parts.
func (l *Logs) Lines(parts ...string) []string {
	var out []string
	for line := range strings.Lines(l.String()) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

// Count returns how many logged lines contain every one of parts.
func (l *Logs) Count(parts ...string) int { return len(l.Lines(parts...)) }

// Discard drops everything klog logs until the test ends, for a benchmark
// whose output must hold benchmark lines only: go test interleaves the
// test binary's stderr with its stdout, and a log line written while a
// result line is being printed breaks benchstat's parsing of it.
func Discard(tb testing.TB) {
	tb.Helper()
	klog.SetSlogLogger(slog.New(slog.DiscardHandler))
	tb.Cleanup(klog.ClearLogger)
}
