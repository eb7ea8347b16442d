package authority

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/pki"
)

// clockSkewError is what the Authority's Secret store returns, together with
// the Secret's state as read, when this replica's clock is the suspect: it
// must not write the Secret. It is not a load error.
type clockSkewError struct {
	reason string
	// waiting: not a skew found but evidence to wait for (after a pause);
	// the replica holds without reporting a skew.
	waiting bool
}

func (e *clockSkewError) Error() string { return "clock skew: " + e.reason }

// clockSkew returns why this replica must not write the CA Secret, whose
// state as just read is st, at now on its own clock; "" when it may.
//
// Every rule rests on evidence other than this one clock, so a single
// replica whose clock lags or leads can never replace, or write over, the
// CA that every replica's clients trust. waiting reports a reason that is
// no skew found, only evidence still to come (after a pause):
//
//   - The Secret: a CA in it that is not yet valid here beyond the skew
//     tolerance, or a successor published (by the publisher's clock) beyond
//     the tolerance in this clock's future, was made by a clock ahead of
//     this one. This clock is the suspect: the CA is never replaced.
//   - The other replicas' Lease renewals: a renewal is seen after it was
//     written, so renewTime minus the time this process saw it is a lower
//     bound of how far the writer's clock is ahead of ours. When more than
//     half of the live replicas, counting this one, are ahead beyond the
//     tolerance, this clock lags. When more than half are behind it, by
//     their renewals (allowing a renewal interval for the renewal to be
//     seen) or by their own word (they list this replica in
//     ClocksAheadAnnotation, from the same lower bound seen from
//     their side), this clock leads.
//   - A pause, or a jump of this clock: when this process stopped watching
//     for longer than the tolerance, the renewals it saw before say nothing
//     about its clock now. It waits until every live replica's next
//     renewal is seen (at most a third of a lease duration).
//   - An expired signing CA: only a CA that has expired for more than half
//     of the live replicas, counting this one, may be replaced (or its
//     successor promoted unobserved). A live replica counts when its
//     renewals show its clock past the CA's NotAfter. With no other replica
//     live, this replica's clock is the only one left and decides.
//
// A replica without replica announcements has only the Secret as
// evidence. With two replicas whose clocks disagree, neither is a majority:
// the Secret decides, and an expired CA is not replaced until the clocks
// agree again.
func (a *Authority) clockSkew(st *caSet, now time.Time) (reason string, waiting bool) {
	tol := a.cfg.SkewTolerance
	for _, c := range []struct {
		what string
		ca   *pki.Issued
	}{{"signing CA", st.signing}, {"successor CA", st.next}} {
		if c.ca != nil && now.Add(tol).Before(c.ca.Cert.NotBefore) {
			return fmt.Sprintf("the %s %q in the Secret is not valid before %s, more than the skew tolerance %v after this replica's clock (%s): this clock is behind",
				c.what, c.ca.Cert.Subject.CommonName, c.ca.Cert.NotBefore.UTC().Format(time.RFC3339), tol, now.UTC().Format(time.RFC3339)), false
		}
	}
	if !st.nextSince.IsZero() && now.Add(tol).Before(st.nextSince) {
		return fmt.Sprintf("the successor CA in the Secret was published at %s on its publisher's clock, more than the skew tolerance %v after this replica's clock (%s): this clock is behind",
			st.nextSince.UTC().Format(time.RFC3339), tol, now.UTC().Format(time.RFC3339)), false
	}
	if a.replicas == nil {
		return "", false
	}
	v := a.replicas.clocks(now)
	all := v.live + 1
	switch {
	case len(v.stale) > 0:
		return fmt.Sprintf("this replica stopped watching the other replicas for longer than the skew tolerance %v (a pause, or its clock jumped); it waits for the next Lease renewals of %s to tell whether its clock agrees",
			tol, strings.Join(v.stale, ", ")), true
	case 2*len(v.ahead) > all:
		return fmt.Sprintf("the Lease renewals of %d of the %d live replicas (%s) are ahead of this replica's clock by more than the skew tolerance %v: this clock is behind",
			len(v.ahead), all, strings.Join(v.ahead, ", "), tol), false
	case 2*len(v.behind) > all:
		return fmt.Sprintf("%d of the %d live replicas (%s) are behind this replica's clock by more than the skew tolerance %v, by their Lease renewals: this clock is ahead",
			len(v.behind), all, strings.Join(v.behind, ", "), tol), false
	}
	if st.signing == nil {
		return "", false
	}
	// A CA adopted without its key ends with the other tool's leaf.
	if end := st.signingEnds(); !now.Before(end) {
		past := 1 // this replica
		for _, d := range v.deltas {
			if !now.Add(d).Before(end) {
				past++
			}
		}
		if 2*past <= all {
			return fmt.Sprintf("the signing CA %q ended at %s on this replica's clock, but only %d of the %d live replicas' clocks are past that by their Lease renewals",
				st.signing.Cert.Subject.CommonName, end.UTC().Format(time.RFC3339), past, all), false
		}
	}
	return "", false
}

// holdForSkew is the check of a replica whose clock is the suspect (see
// Authority.clockSkew): it writes nothing and issues no leaf, since a leaf
// dated by a clock that leads is not yet valid for everyone else. It takes
// the Secret's bundle as read, so its consumers and its announcement stay
// current and a successor does not wait for it, and keeps serving the leaf
// it has. Its readiness (RotationCheck) fails naming the skew; the episode
// is counted in evercert_clock_skew_total, logged and sent as a Warning
// Event once, when it starts.
func (i *issuer) holdForSkew(st *caSet, now time.Time, reason string, waiting bool) {
	started := false
	if waiting {
		// No skew found: evidence to wait for, briefly, after a pause.
		klog.Background().V(2).Info("Not writing the CA secret until the other replicas' clocks are known again", "provider", i.cfg.name, "detail", reason)
	} else {
		i.mu.Lock()
		started = i.skew == ""
		i.skew = reason
		i.mu.Unlock()
	}
	if started {
		certmetrics.ClockSkew(i.cfg.name, true)
		klog.Background().Error(nil, "Clock skew: this replica does not write the CA secret and issues no leaf until its clock agrees again",
			"provider", i.cfg.name, "detail", reason)
		i.report.Event(corev1.EventTypeWarning, dynamiccert.ReasonClockSkew, certreport.ActionRotate,
			"this replica does not write the CA Secret until its clock agrees: "+reason)
	}
	if st == nil || st.signing == nil {
		return
	}
	if err := i.adopt(st, now, false); err != nil {
		klog.Background().Error(err, "Taking the CA secret's bundle while the clock is skewed failed", "provider", i.cfg.name)
	}
}

// clockAgrees ends a skew episode, if one was going on.
func (i *issuer) clockAgrees() {
	i.mu.Lock()
	was := i.skew
	i.skew = ""
	i.mu.Unlock()
	if was != "" {
		klog.Background().Info("Clock agrees again with the CA secret and the other replicas", "provider", i.cfg.name)
	}
}
