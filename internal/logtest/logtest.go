// Package logtest holds a test logger that keeps what it is given, so that
// a test can count the lines a component logs through klog.FromContext.
package logtest

import (
	"context"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// Logs is what a logger from New was given; it is safe for concurrent use.
type Logs struct{ buf ktesting.Buffer }

// New returns a logger that writes to t's log and keeps every entry in
// Logs, and a context carrying that logger (klog.NewContext).
func New(t testing.TB) (klog.Logger, context.Context, *Logs) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	return logger, klog.NewContext(context.Background(), logger), &Logs{logger.GetSink().(ktesting.Underlier).GetBuffer()}
}

// Errors counts the error entries whose message starts with prefix.
func (l *Logs) Errors(prefix string) int { return l.count(ktesting.LogError, prefix) }

// Infos counts the info entries, at any verbosity, whose message starts
// with prefix.
func (l *Logs) Infos(prefix string) int { return l.count(ktesting.LogInfo, prefix) }

func (l *Logs) count(typ ktesting.LogType, prefix string) int {
	n := 0
	for _, e := range l.buf.Data() {
		if e.Type == typ && strings.HasPrefix(e.Message, prefix) {
			n++
		}
	}
	return n
}

// Entries returns every entry so far, in order.
func (l *Logs) Entries() ktesting.Log { return l.buf.Data() }

// String returns the entries as text, for a failure message.
func (l *Logs) String() string { return l.buf.String() }
