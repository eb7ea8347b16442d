package cabundle

import "strings"

// This file holds the log-once bookkeeping: a state is logged when an
// object enters it, not at every retry or resync.

// objectKey identifies one object, e.g. "ValidatingWebhookConfiguration/x",
// in the bookkeeping, in Pending and in the health check.
func objectKey(kind Kind, name string) string { return string(kind) + "/" + name }

// logState logs msg (at info level) when key enters state, and nothing while
// it stays there, so that a target waiting for hours logs once. Leaving an
// error state for "ok" logs a recovery. An empty msg logs nothing.
func (p *Publisher) logState(key, state, msg string, kv ...any) {
	p.mu.Lock()
	prev, seen := p.logged[key]
	p.logged[key] = state
	p.mu.Unlock()
	if seen && prev == state {
		return
	}
	if msg != "" {
		p.logger.Info(msg, kv...)
	} else if strings.HasPrefix(prev, "error: ") {
		p.logger.Info("caBundle publishing recovered", "object", key)
	}
}

// loggedState returns the state last logged for key, "" if none.
func (p *Publisher) loggedState(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logged[key]
}

// logErrorOnce logs err unless the last error logged for key had the same
// text: a permanent failure (say, forbidden) retried with backoff logs once,
// not at every retry.
func (p *Publisher) logErrorOnce(key string, err error) {
	state := "error: " + err.Error()
	p.mu.Lock()
	prev := p.logged[key]
	p.logged[key] = state
	p.mu.Unlock()
	if prev != state {
		p.logger.Error(err, "Failed to publish caBundle, will retry with backoff", "object", key)
	}
}
