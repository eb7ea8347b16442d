// Package backoff is evercert's one retry policy: every retry path (API
// errors, file writes, registrations) waits exponentially longer between
// attempts, with jitter so that replicas do not retry in step, up to a cap,
// and never less than a server's Retry-After.
//
// It only computes delays. Callers wait on their own injected clock, so a
// test that steps a fake clock drives retries exactly as production time
// would.
package backoff

import (
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Defaults for API retries, as client-go's reflector uses: 800 ms doubling
// up to 30 s.
const (
	DefaultInitial = 800 * time.Millisecond
	DefaultCap     = 30 * time.Second
	// Jitter is the fraction by which each delay may be lengthened at random
	// (wait.Jitter): a delay d becomes a value in [d, d*(1+Jitter)).
	Jitter = 0.5
)

// Backoff hands out the delays of one retry sequence. It is not safe for
// concurrent use; each retry loop owns one.
type Backoff struct {
	initial, cap time.Duration
	cur          wait.Backoff
}

// New returns a Backoff whose first delay is initial (DefaultInitial if not
// positive), doubling at each failure up to cap (DefaultCap if not
// positive), each delay lengthened by up to Jitter at random.
func New(initial, cap time.Duration) *Backoff {
	if initial <= 0 {
		initial = DefaultInitial
	}
	if cap <= 0 {
		cap = DefaultCap
	}
	cap = max(cap, initial)
	b := &Backoff{initial: initial, cap: cap}
	b.Reset()
	return b
}

// Next returns how long to wait before retrying after err. An API error
// that carries a Retry-After (a 429, or a 5xx with the header) waits at
// least that long, even beyond the cap: the server asked for it.
func (b *Backoff) Next(err error) time.Duration {
	d := b.cur.Step()
	if seconds, ok := apierrors.SuggestsClientDelay(err); ok && seconds > 0 {
		d = max(d, time.Duration(seconds)*time.Second)
	}
	return d
}

// Reset starts the sequence over; call it after a success.
func (b *Backoff) Reset() {
	b.cur = wait.Backoff{
		Duration: b.initial,
		Factor:   2,
		Jitter:   Jitter,
		// Steps only limits how often the delay grows; Cap stops it.
		Steps: int(^uint(0) >> 1),
		Cap:   b.cap,
	}
}

// Cap returns the longest delay Next returns without a Retry-After, jitter
// included.
func (b *Backoff) Cap() time.Duration {
	return time.Duration(float64(b.cap) * (1 + Jitter))
}
