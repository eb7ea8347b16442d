// Package backoff is evercert's one retry policy: every retry path (API
// errors, file writes, registrations) waits exponentially longer between
// attempts, with jitter so that replicas do not retry in step, up to a cap,
// and never less than a server's Retry-After.
//
// A Backoff only computes delays: loops that also wait for other things
// wait on their own injected clock. Retry is the loop for the plain case,
// an attempt repeated until it succeeds. Either way the wait is on an
// injected clock, so a test that steps a fake clock drives retries exactly
// as production time would.
//
// See docs/architecture.md for how the packages fit together.
package backoff

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
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
	// jitter, when set, draws the jitter instead of math/rand (see
	// SetJitterSource).
	jitter func() float64
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
	if b.jitter != nil {
		d += time.Duration(Jitter * b.jitter() * float64(d))
	}
	if seconds, ok := apierrors.SuggestsClientDelay(err); ok && seconds > 0 {
		d = max(d, time.Duration(seconds)*time.Second)
	}
	return d
}

// SetJitterSource makes the jitter come from f (values in [0, 1)) instead
// of math/rand's global source, so that a seeded simulation retries at the
// same instants on every run. The delays keep their distribution.
func (b *Backoff) SetJitterSource(f func() float64) {
	b.jitter = f
	b.Reset()
}

// Reset starts the sequence over; call it after a success.
func (b *Backoff) Reset() {
	jitter := Jitter
	if b.jitter != nil {
		jitter = 0 // drawn in Next
	}
	b.cur = wait.Backoff{
		Duration: b.initial,
		Factor:   2,
		Jitter:   jitter,
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

// Retry calls attempt until it returns nil (Retry returns true) or ctx ends
// (false), waiting on clk between attempts with a Backoff from initial to
// cap (see New). After each failure that is not due to ctx ending, failed,
// when not nil, is told the error and the delay before the next attempt; it
// is where a caller logs, typically with an errlog.Once.
func Retry(ctx context.Context, clk clock.Clock, initial, cap time.Duration, attempt func(context.Context) error, failed func(err error, delay time.Duration)) bool {
	b := New(initial, cap)
	for {
		err := attempt(ctx)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		delay := b.Next(err)
		if failed != nil {
			failed(err, delay)
		}
		t := clk.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C():
		}
	}
}
