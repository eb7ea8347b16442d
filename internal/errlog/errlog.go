// Package errlog holds evercert's one way of logging a condition that lasts:
// a failure retried with backoff, or a wait for something to appear, is
// logged when it starts, not at every retry, resync or event; a different
// failure is logged again; and the return to health is logged once.
//
// Every method takes the klog.Logger to write to, so that callers log
// through the logger of their context (klog.FromContext(ctx)) like the rest
// of the code.
//
// See docs/architecture.md for how the packages fit together.
package errlog

import (
	"sync"

	"k8s.io/klog/v2"
)

// errorPrefix starts the state of an error condition, as State returns it.
const errorPrefix = "error: "

// Once remembers the condition last logged for one thing (a file, an
// object, a retry loop). The zero value is ready to use: nothing logged
// yet, healthy. A Once is safe for concurrent use.
type Once struct {
	mu sync.Mutex
	// state is "" while healthy, errorPrefix+the error's text while
	// failing, or the state given to Info.
	state string
	key   string // failureKey of err
	err   error  // the error of an error state, nil otherwise
}

// Error records err and logs it, with msg and keysAndValues, at error level
// unless the condition last logged is the same failure: an error with the
// same text and, when WithContent marked it, about the same content. A
// failure that comes back at every retry is logged once, and a different
// one is logged again. It reports whether it logged. err must not be nil.
// The error is logged as is: it must name its source and hold no secret
// (private keys, PEM).
func (o *Once) Error(logger klog.Logger, err error, msg string, keysAndValues ...any) bool {
	state, key := errorPrefix+err.Error(), failureKey(err)
	o.mu.Lock()
	changed := o.state != state || o.key != key
	o.state, o.key, o.err = state, key, err
	o.mu.Unlock()
	if changed {
		logger.Error(err, msg, keysAndValues...)
	}
	return changed
}

// Info records the condition named state (such as "waiting: missing"),
// which is not an error, and logs msg with keysAndValues at info level when
// it starts, that is when the condition last logged was another one. It
// reports whether it logged. state must not be empty.
func (o *Once) Info(logger klog.Logger, state, msg string, keysAndValues ...any) bool {
	o.mu.Lock()
	changed := o.state != state
	o.state, o.key, o.err = state, "", nil
	o.mu.Unlock()
	if changed {
		logger.Info(msg, keysAndValues...)
	}
	return changed
}

// Recovered records that the thing is healthy again. If the condition last
// logged was an error, it logs msg with keysAndValues at info level, so that
// the end of a failure logged at error level is visible too, and reports
// true; otherwise it logs nothing.
func (o *Once) Recovered(logger klog.Logger, msg string, keysAndValues ...any) bool {
	if !o.Reset() {
		return false
	}
	logger.Info(msg, keysAndValues...)
	return true
}

// Reset records that the thing is healthy again without logging, for a
// caller that reports the recovery in a log line of its own. It reports
// whether the condition last logged was an error.
func (o *Once) Reset() (wasError bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	wasError = o.err != nil
	o.state, o.key, o.err = "", "", nil
	return wasError
}

// Err returns the error of the current condition, nil while healthy or in
// a condition that is not an error.
func (o *Once) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// State describes the current condition, for a health check or status: ""
// while healthy, the state given to Info, or "error: " followed by the
// error's text.
func (o *Once) State() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.state
}

// ByKey is a Once per key, for a component that logs about many things
// (one per object, say). The zero value is ready to use, and a ByKey is
// safe for concurrent use.
type ByKey struct {
	mu   sync.Mutex
	once map[string]*Once
}

// Get returns the Once of key, creating it (healthy) on first use.
func (b *ByKey) Get(key string) *Once {
	b.mu.Lock()
	defer b.mu.Unlock()
	o, ok := b.once[key]
	if !ok {
		if b.once == nil {
			b.once = make(map[string]*Once)
		}
		o = &Once{}
		b.once[key] = o
	}
	return o
}

// State returns the state of key's Once (see [Once.State]) without creating
// it: "" for a key never used.
func (b *ByKey) State(key string) string {
	b.mu.Lock()
	o, ok := b.once[key]
	b.mu.Unlock()
	if !ok {
		return ""
	}
	return o.State()
}

// Forget drops the Once of key, for a thing that is gone (a deleted
// object), so that keys do not accumulate. A key used again afterwards
// starts healthy.
func (b *ByKey) Forget(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.once, key)
}
