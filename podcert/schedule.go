package podcert

import (
	"errors"
	"fmt"
	"time"

	"github.com/evercert/evercert/authority"
)

// ErrCANeverCoversMinLifetime is wrapped by NewSigner's error when the CA's
// schedule can never give a leaf MinLifetime, so every request would wait
// forever (the API never issues less).
var ErrCANeverCoversMinLifetime = errors.New("the signing CA can never cover the API's minimum leaf lifetime")

// CASchedule is the part of an Authority's schedule that bounds the leaves
// a Signer can issue: authority.Config's CALifetime,
// CARenewBefore and PropagationDelay, with their defaults filled in.
type CASchedule struct {
	CALifetime, CARenewBefore, PropagationDelay time.Duration
}

// scheduleReporter is implemented by *authority.Authority.
type scheduleReporter interface {
	Config() authority.Config
}

// caSchedule returns ca's schedule, if it reports one.
func caSchedule(ca LeafSigner) (CASchedule, bool) {
	r, ok := ca.(scheduleReporter)
	if !ok {
		return CASchedule{}, false
	}
	c := r.Config()
	return CASchedule{CALifetime: c.CALifetime, CARenewBefore: c.CARenewBefore, PropagationDelay: c.PropagationDelay}, true
}

// LongestLeaf is the longest leaf the schedule's CAs can sign once they
// rotate, at the best moment: right after a successor starts signing.
//
// SignLeaf caps a leaf at its CA's NotAfter and backdates its NotBefore by
// backdate (the CA is backdated by its skew tolerance, at least 5 minutes,
// which is more than any Signer backdate, so the leaf's NotBefore is never
// moved up to the CA's), so a leaf signed at now by a CA ending at NotAfter
// lives at most NotAfter-now+backdate. A successor CA is made at the
// moment t it is published and ends at t+CALifetime; it signs no earlier
// than t+PropagationDelay (each replica counts that delay from when it
// first saw it, so clock skew between replicas only lengthens it, and
// observers can only hold it back longer). Whole-second truncation of
// NotAfter and of the signing time costs up to one more second:
//
//	LongestLeaf = CALifetime - PropagationDelay + backdate - 1s
//
// The very first CA of a new Secret signs at once and gives up to
// PropagationDelay more, for its first life only. Clock skew only lowers
// the bound: a successor made by a replica whose clock lags this one's by
// d (accepted up to the Authority's SkewTolerance) ends d sooner on this
// clock. NewSigner refuses a schedule whose LongestLeaf is below
// MinLifetime, which cannot work even with every clock right; leave room
// for SkewTolerance above it.
func (s CASchedule) LongestLeaf(backdate time.Duration) time.Duration {
	return s.CALifetime - s.PropagationDelay + backdate - time.Second
}

// LeafAlways is the longest leaf the schedule's CAs can sign at every
// moment of a healthy rotation, one whose successor is observed as soon as
// its PropagationDelay ends: the old CA keeps signing until then, and its
// leaves shrink to CARenewBefore-PropagationDelay+backdate-1s. A request
// whose lifetime is longer waits during part of every rotation (see
// Signer.HealthCheck).
func (s CASchedule) LeafAlways(backdate time.Duration) time.Duration {
	return s.CARenewBefore - s.PropagationDelay + backdate - time.Second
}

// check returns an error wrapping ErrCANeverCoversMinLifetime when
// LongestLeaf is below MinLifetime.
func (s CASchedule) check(backdate time.Duration) error {
	if longest := s.LongestLeaf(backdate); longest < MinLifetime {
		return fmt.Errorf("%w: CA lifetime %v minus propagation delay %v plus backdate %v leaves at most %v for a leaf (less 1s of rounding), "+
			"less than the %v the API requires, so every request would wait forever; "+
			"give CAs a lifetime of at least %v plus the propagation delay",
			ErrCANeverCoversMinLifetime, s.CALifetime, s.PropagationDelay, backdate, max(longest, 0), MinLifetime, MinLifetime-backdate+time.Second)
	}
	return nil
}
