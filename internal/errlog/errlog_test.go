package errlog

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/evercert/evercert/internal/logtest"
)

// line is one log call, as the tests compare it.
type line struct {
	error bool
	msg   string
	err   string
}

// recorder returns the calls a test logger (internal/logtest) was given
// and not yet taken.
type recorder struct {
	logs  *logtest.Logs
	taken int
}

func (r *recorder) take() []line {
	var out []line
	entries := r.logs.Entries()
	for _, e := range entries[r.taken:] {
		l := line{error: e.Type == ktesting.LogError, msg: e.Message}
		if e.Err != nil {
			l.err = e.Err.Error()
		}
		out = append(out, l)
	}
	r.taken = len(entries)
	return out
}

func newRecorder(t *testing.T) (*recorder, klog.Logger) {
	logger, _, logs := logtest.New(t)
	return &recorder{logs: logs}, logger
}

func TestOnceLogsEachDistinctErrorOnce(t *testing.T) {
	rec, logger := newRecorder(t)
	var o Once
	forbidden := errors.New("forbidden")
	for range 5 {
		o.Error(logger, fmt.Errorf("write x: %w", forbidden), "Write failed")
	}
	if got := rec.take(); len(got) != 1 || !got[0].error || got[0].err != "write x: forbidden" || got[0].msg != "Write failed" {
		t.Fatalf("five retries of one error logged %+v, want one error line", got)
	}
	if !errors.Is(o.Err(), forbidden) {
		t.Errorf("Err() = %v, want the last error", o.Err())
	}
	if got := o.State(); got != "error: write x: forbidden" {
		t.Errorf("State() = %q", got)
	}

	// Another error is logged, and so is the first one when it comes back.
	if !o.Error(logger, errors.New("timeout"), "Write failed") {
		t.Error("a different error was not logged")
	}
	if !o.Error(logger, errors.New("write x: forbidden"), "Write failed") {
		t.Error("the first error, back after another one, was not logged")
	}
	if o.Error(logger, errors.New("write x: forbidden"), "Write failed") {
		t.Error("a repeated error was logged again")
	}
	if got := rec.take(); len(got) != 2 {
		t.Errorf("logged %+v, want two lines", got)
	}
}

func TestOnceRecoveryIsLoggedOnceAfterAnError(t *testing.T) {
	rec, logger := newRecorder(t)
	var o Once
	if o.Recovered(logger, "Recovered") {
		t.Error("Recovered without an error logged")
	}
	o.Error(logger, errors.New("boom"), "Failed")
	if !o.Recovered(logger, "Recovered", "path", "/x") {
		t.Error("Recovered after an error did not log")
	}
	if o.Recovered(logger, "Recovered") {
		t.Error("a second Recovered logged again")
	}
	got := rec.take()
	if len(got) != 2 || got[1].error || got[1].msg != "Recovered" {
		t.Fatalf("logged %+v, want the error then one recovery", got)
	}
	if o.Err() != nil || o.State() != "" {
		t.Errorf("after recovery Err() = %v, State() = %q, want healthy", o.Err(), o.State())
	}
	// After a recovery the same error is news again.
	if !o.Error(logger, errors.New("boom"), "Failed") {
		t.Error("the error, back after a recovery, was not logged")
	}
}

func TestOnceResetReportsAnErrorWithoutLogging(t *testing.T) {
	rec, logger := newRecorder(t)
	var o Once
	if o.Reset() {
		t.Error("Reset of a healthy Once reported an error")
	}
	o.Error(logger, errors.New("boom"), "Failed")
	if !o.Reset() {
		t.Error("Reset after an error did not report it")
	}
	if got := rec.take(); len(got) != 1 {
		t.Errorf("logged %+v, want only the error", got)
	}
}

func TestOnceInfoLogsWhenAConditionStarts(t *testing.T) {
	rec, logger := newRecorder(t)
	var o Once
	for range 3 {
		o.Info(logger, "waiting: missing", "Waiting for the object")
	}
	if o.State() != "waiting: missing" || o.Err() != nil {
		t.Errorf("State() = %q, Err() = %v", o.State(), o.Err())
	}
	o.Info(logger, "waiting: no webhooks", "Waiting for a webhook")
	o.Error(logger, errors.New("boom"), "Failed")
	o.Info(logger, "waiting: missing", "Waiting for the object")
	// Leaving a condition that is not an error is not a recovery.
	if o.Recovered(logger, "Recovered") {
		t.Error("leaving a wait logged a recovery")
	}
	got := rec.take()
	want := []line{
		{msg: "Waiting for the object"},
		{msg: "Waiting for a webhook"},
		{error: true, msg: "Failed", err: "boom"},
		{msg: "Waiting for the object"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("logged\n%+v\nwant\n%+v", got, want)
	}
}

func TestOnceConcurrentCallersLogOnce(t *testing.T) {
	rec, logger := newRecorder(t)
	var o Once
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				o.Error(logger, errors.New("boom"), "Failed")
				_ = o.State()
			}
		})
	}
	wg.Wait()
	if got := rec.take(); len(got) != 1 {
		t.Errorf("800 concurrent reports of one error logged %d lines, want 1", len(got))
	}
}

func TestByKeyKeepsOneOncePerKey(t *testing.T) {
	rec, logger := newRecorder(t)
	var b ByKey
	if b.State("a") != "" {
		t.Error("unknown key has a state")
	}
	b.Get("a").Error(logger, errors.New("boom"), "Failed")
	b.Get("b").Error(logger, errors.New("boom"), "Failed")
	b.Get("a").Error(logger, errors.New("boom"), "Failed")
	if got := rec.take(); len(got) != 2 {
		t.Errorf("one error on each of two keys logged %d lines, want 2", len(got))
	}
	if b.State("a") != "error: boom" {
		t.Errorf("State(a) = %q", b.State("a"))
	}
	if first := b.Get("a"); b.Get("a") != first {
		t.Error("Get returns a new Once each time")
	}
	b.Forget("a")
	if b.State("a") != "" {
		t.Error("a forgotten key keeps its state")
	}
	if !b.Get("a").Error(logger, errors.New("boom"), "Failed") {
		t.Error("the error of a forgotten key was not logged again")
	}
}
