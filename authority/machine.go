package authority

import (
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/pki"
)

// Phase is where a CA rotation stands, as one process sees it after its
// last check (RotationStatus.Phase). The rotation moves through the phases
// in one function, machine.step; docs/architecture.md draws the diagram and
// names the invariant each transition protects.
type Phase string

const (
	// PhaseStarting: no CA state yet (before the first check, or while an
	// Authority waits for a pre-created Secret).
	PhaseStarting Phase = "Starting"
	// PhaseSigning: one CA signs and no successor is published.
	PhaseSigning Phase = "Signing"
	// PhaseSuccessorPublished: a successor is in every bundle and its
	// minimum propagation delay runs; the old CA still signs.
	PhaseSuccessorPublished Phase = "SuccessorPublished"
	// PhaseSuccessorObserving: the delay is over; the successor signs as
	// soon as every observer and every live replica confirms it
	// (RotationStatus.Successor.Pending names who has not).
	PhaseSuccessorObserving Phase = "SuccessorObserving"
	// PhaseEmergency: the signing CA is marked compromised
	// (CompromisedCAAnnotation): its successor signs as soon as it is
	// observed, without the delay (RotationStatus.Emergency).
	PhaseEmergency Phase = "Emergency"
	// PhaseStalled: the signing CA is within the leaf renew-before of its
	// end and no successor signs yet; readiness fails (RotationCheck).
	PhaseStalled Phase = "Stalled"
	// PhaseSuspect: this replica's clock disagrees with the Secret or with
	// the other replicas (RotationStatus.ClockSkew): it decides and writes
	// nothing and issues no leaf; readiness fails.
	PhaseSuspect Phase = "Suspect"
	// PhaseBroken: the Authority's Secret cannot be used as read and this
	// replica cannot repair it (RotationStatus.Broken).
	PhaseBroken Phase = "Broken"
)

// machine is the rotation's state machine: step is its one transition. It
// does no I/O. The stores (secretStore, memoryStore) read the state and
// carry out step's decision; the issuer feeds it the observers' answers
// and reports what it returns. Making a CA is the one effect it asks for,
// through sched.newCA (a key store may be behind it); the simulator swaps
// in a cheap one.
type machine struct {
	sched rotation
	// emerg handles the operator's requests; nil for SelfSigned.
	emerg *emergency
	// repair reports hand edits of an Authority's Secret; nil for
	// SelfSigned, whose state nobody else writes.
	repair *secretRepair
	// judge says why this replica's clock must not change the state as
	// read (Authority.clockSkew), "" when it may; nil for SelfSigned.
	judge func(st *caSet, now time.Time) (reason string, waiting bool)
	// writer tells the rotator an Authority adopted from still rewriting
	// the Secret (foreignWriter); nil for SelfSigned.
	writer *foreignWriter
}

// mutations take rules of the machine back to older, wrong ones. Only the
// simulator's mutation test sets them (simulate_test.go), to show that
// each invariant it checks can fail; every real process leaves them false.
var mutations struct {
	// delayFromStart: a successor's delay runs from this process's first
	// sight of it, whatever the recorded publication, and it is announced
	// only after that (issue 27 §1, rollouts stall every rotation).
	delayFromStart bool
	// pastedSigns: a CA pasted into the signing slot signs as it is
	// (issue 27 §3).
	pastedSigns bool
	// brokenSilent: a Secret this replica cannot repair is waited on
	// without a word (issue 27 §3).
	brokenSilent bool
	// ignoreObservers: a successor signs once its delay is over, observed
	// or not.
	ignoreObservers bool
	// compromisedSigns: a CA marked compromised still signs leaves (for a
	// replica that has none, or whose leaf is due).
	compromisedSigns bool
	// serveAtOnce: a replica that was cut off while the others promoted a
	// CA serves a leaf of it at once and says it is ready (no keepOldLeaf,
	// no CatchingUp).
	serveAtOnce bool
	// catchUpAtStart: a process's first read of a signing CA counts as
	// the CA reaching its bundle now, whoever made it, so a new replica
	// is CatchingUp for the propagation delay (a NotReady fleet at
	// start; the bootstrap readiness the simulator checks, R1).
	catchUpAtStart bool
	// catchUpAfter: like catchUpAtStart, but only for a process whose
	// first read comes after this time (a restart or a rollout, not the
	// fleet's start): the restarted replica is CatchingUp for the
	// propagation delay, which R1 (start only) and L1 (some replica
	// ready) do not see and R2 does. Zero: off.
	catchUpAfter time.Time
	// trimIgnoresPeers: the trim after another writer's rewrites keeps
	// only this replica's CAs, as if no live peer announced a leaf.
	trimIgnoresPeers bool
	// holdOmitsForeignCA: a replica that holds on another writer's
	// rewrites serves its last bundle as it was, without that writer's
	// current CA.
	holdOmitsForeignCA bool
}

// stepInput is what one check read.
type stepInput struct {
	now time.Time
	// read is the state as read; empty (not nil) when there is none yet.
	read *caSet
	// exists: the state was read from an existing Secret (false: it was
	// deleted, or never created).
	exists bool
	// last is the state this process last had in force; nil before its
	// first check.
	last *caSet
	// consumersMayLack, when set, reports whether the consumers of this
	// process's bundle may lack a successor it finds published at its first
	// read (replicaSet.consumersMayLack); nil: they have it (SelfSigned has
	// no restart).
	consumersMayLack func(*x509.Certificate) bool
	// declares are the caBundle targets this process's observers stand for
	// (TargetObserver), declared in the state (machine.declareTargets).
	declares []string
	// adopted: read from another rotator's layout; written back in ours.
	adopted bool
	// serving is the CA of the leaf this process serves, nil before its
	// first leaf.
	serving *x509.Certificate
	// peerServes reports whether a peer's Lease, live or expired but not
	// yet collected, announces a leaf signed by a CA (replicaSet.announces;
	// an unlisted peer counts as serving every CA); nil without
	// announcements. The trim after another writer's rewrites and a
	// retirement keep such a CA (foreignWriter.kept, machine.retire).
	peerServes func(*x509.Certificate) bool
	// marks are the evercert.io annotations of the Secret as read
	// (evercertMarks): the Authority's own, never a foreign writer's.
	marks []string
	// written is the Secret's WrittenCAAnnotation as read ("" when
	// absent): the signing CA of the Authority's last write of it.
	written string
	// repairs name the parts of a hand-edited Secret that did not parse and
	// were filled from last: written back.
	repairs []string
	obs     observation
}

// stepResult is what step decided.
type stepResult struct {
	// state is the state in force after the step.
	state *caSet
	// write: state differs from what was read and must be written.
	write bool
	// restored: CAs this process knew were lost (a deletion, a rollback)
	// and are written back.
	restored bool
	// unsafe: a CA began to sign before it was observed (counted), for
	// the reason unsafeWhy.
	unsafe    bool
	unsafeWhy string
	// repairs say what this step writes back after a hand edit.
	repairs []string
	// declarationOnly: the write only renews or drops caBundle target
	// declarations (declareTargets); the state as read is in force whether
	// or not it succeeds, so a replica whose Secret writes fail (a lost
	// race, RBAC) still adopts and announces what it read.
	declarationOnly bool
	// undeclared: this process's caBundle targets that the full list of
	// declarations had no room for (declareTargets).
	undeclared []string
	// skew, when set, is why this replica's clock is the suspect: nothing
	// was decided, state is the state as read and must not be written.
	skew *clockSkewError
}

// step is the rotation's one transition, at in.now on this process's clock:
//
//  0. A Secret that the rotator it was adopted from keeps rewriting with
//     new CAs after this process adopted or wrote it is held: nothing is
//     decided or written until it is left alone for a check interval, then
//     it is adopted once, keeping only the CAs a served leaf needs
//     (foreignWriter): neither side's clients lose trust, and ca.crt does
//     not collect every CA of the overlap. Never a Secret with an
//     operator's mark or an emergency's record (the emergency of step 5
//     runs at once, whatever the hold), nor one in the Authority's own
//     layout that carries its annotations (a peer's write); a CA the trim
//     left out never signs again (restore).
//  1. A CA pasted into the Secret's signing slot that no bundle publishes
//     becomes the successor (secretRepair.unpublished), so it never signs
//     unobserved (S2).
//  2. A replica whose clock is the suspect decides nothing (Suspect): a
//     lagging or leading clock must never replace the CA that every
//     replica's clients trust (S1).
//  3. The successor's minimum delay keeps running from when this process
//     first saw it, or from its recorded publication after a restart
//     (rotation.delayStart): restarts never start it over (L1).
//  4. A promotion no replica could have made yet (a hand edit) is counted
//     as an unsafe rotation (handPromoted, S1); CAs this process knew and
//     the Secret lost come back (restore), so no client loses trust in a CA
//     that still signs leaves (S1).
//  5. The operator's requests are acted on (emergency.decide): a CA marked
//     compromised stops signing as soon as its successor is observed and
//     leaves every bundle once no live replica serves a leaf it signed (S3).
//  6. The schedule advances (rotation.advance): publish a successor,
//     promote it once observed and its delay is over, retire expired CAs
//     (S1, S2); a promotion forced by the signing CA's end is unsafe and
//     counted. Observed includes every caBundle target declared in the
//     state (declareTargets renews this process's own and drops the lapsed
//     ones): a live replica's announcement must cover each, so a publisher
//     that is down is waited for (S2). An emergency does not wait for them
//     (step 5) and counts the promotion unsafe.
func (m *machine) step(in stepInput) (stepResult, error) {
	st, now := in.read, in.now
	res := stepResult{state: st, repairs: in.repairs}
	hold, trim := m.writer.decide(in)
	if hold != nil {
		return res, hold
	}
	var readSigning *x509.Certificate // before restore, the emergency and the schedule
	if st.signing != nil {
		readSigning = st.signing.Cert
	}
	if m.repair != nil && !in.adopted && !mutations.pastedSigns {
		pasted, err := m.repair.unpublished(st, in.last, now)
		if err != nil {
			return res, err
		}
		if pasted != "" {
			res.repairs = append(res.repairs, pasted)
		}
	}
	if m.repair != nil {
		if len(res.repairs) == 0 {
			m.repair.healthy()
		} else {
			m.repair.setReason("") // written back below, or decided again after a conflict
		}
	}
	var skew string
	var waiting bool
	if m.judge != nil {
		// Judged on the Secret as written, before this process fills in
		// what it lacks (an unknown publication time) from its own clock.
		skew, waiting = m.judge(st, now)
	}
	// After the judge: a peer's leaf of a recorded CA is believed only
	// once the CA is among the roots it chains to.
	m.trustRecorded(st, in)
	if st.next != nil {
		// A successor found published at this process's first read is
		// inherited: its delay runs from the recorded publication and it
		// is announced at once, unless this pod's consumers may lack it.
		st.seenSince, st.inherited = now, in.last == nil && (in.consumersMayLack == nil || !in.consumersMayLack(st.next.Cert)) && !mutations.delayFromStart
		if in.last != nil && in.last.next != nil && in.last.next.Cert.Equal(st.next.Cert) {
			st.seenSince, st.inherited = in.last.seenSince, in.last.inherited
		}
		if st.nextSince.IsZero() {
			st.nextSince = st.seenSince // publication time unknown
		}
	}
	if st.signing != nil {
		// When did this process's bundle first hold the signing CA, for
		// its consumers' sake (keepOldLeaf, RotationStatus.CatchingUp)?
		// Zero: they had it from the start.
		switch {
		case in.last == nil:
			if mutations.catchUpAtStart || !mutations.catchUpAfter.IsZero() && now.After(mutations.catchUpAfter) || in.consumersMayLack != nil && in.consumersMayLack(st.signing.Cert) {
				st.signingSince = now
			}
		case in.last.signing != nil && in.last.signing.Cert.Equal(st.signing.Cert):
			st.signingSince = in.last.signingSince
		case in.last.next != nil && in.last.next.Cert.Equal(st.signing.Cert):
			// Promoted by another replica. An emergency's successor signs
			// without the delay by design (whatever the annotations say
			// later: an operator may clear them).
			if !in.last.inherited && !in.last.emergencyActive() {
				st.signingSince = in.last.seenSince
			}
		default:
			st.signingSince = now
		}
	}
	if skew != "" {
		res.skew = &clockSkewError{reason: skew, waiting: waiting}
		return res, nil
	}
	if why := m.handPromoted(st, in.last, now); why != "" {
		res.unsafe, res.unsafeWhy = true, why
	}
	// The declared caBundle targets (st.targets, as declareTargets below
	// leaves them) are observers too: a CA signs observed only once a live
	// replica covers each (the simulator, wider set, seed 2231: a successor
	// copied into tls.crt by hand signed uncounted while the only
	// publisher was paused).
	obs := in.obs
	if all, lacking := obs.all, obs.lacking; all != nil {
		obs.uncovered = func(c *x509.Certificate) []string { return m.uncoveredTargets(st, c, in.obs.covered) }
		obs.all = func(c *x509.Certificate) bool { return len(obs.uncovered(c)) == 0 && all(c) }
		// A promotion forced by the signing CA's end with a declared target
		// uncovered is unsafe: that target's clients may lack the CA.
		obs.lacking = func(c *x509.Certificate) bool { return len(obs.uncovered(c)) > 0 || lacking != nil && lacking(c) }
	}
	copied, why := m.handCopied(st, obs)
	if why != "" {
		res.unsafe, res.unsafeWhy = true, why
	}
	var keep []*x509.Certificate // nil: all that last had
	if trim && in.last != nil {
		peerServes := in.peerServes
		if mutations.trimIgnoresPeers && peerServes != nil {
			peerServes = func(*x509.Certificate) bool { return false }
		}
		keep = m.writer.kept(in.last, in.serving, peerServes)
		if st.next != nil && !containsCert(st.bundle, st.next.Cert) && in.last.knows(st.next.Cert) {
			// Our successor, left in the Secret by a writer that rewrote
			// only its own keys (cert-manager keeps next.crt): it was
			// published, and stays so.
			keep = append(keep, st.next.Cert)
		}
	}
	served := func(c *x509.Certificate) bool {
		return in.serving != nil && in.serving.Equal(c) || in.peerServes != nil && in.peerServes(c) || m.emerg.served(c)
	}
	res.restored = m.restore(st, in.last, in.exists, now, keep, served)
	retiring := false
	if trim {
		// What the trim left out never signs again (restore).
		m.writer.trim(in.last, st, now)
		// What it kept for a leaf served then leaves once every leaf
		// signed with it has expired (retire.go).
		retiring = in.peerServes != nil && m.writer.retireKept(st, now)
	}
	retired := m.retire(st, now, served)
	declared, undeclared := m.declareTargets(st, in.declares, now)
	res.undeclared = undeclared
	// The emergency waits for every observer and live replica, not for
	// declared targets no live replica covers (see emergency.decide).
	emergObs := obs
	emergObs.all = in.obs.all
	acted, unsafeWhy, err := m.emerg.decide(st, now, emergObs)
	if err != nil {
		return res, err
	}
	if unsafeWhy != "" {
		res.unsafe, res.unsafeWhy = true, unsafeWhy
	}
	var uncovered []string
	if st.next != nil && obs.uncovered != nil {
		uncovered = obs.uncovered(st.next.Cert) // as it stood before advance
	}
	changed, unsafe, err := m.sched.advance(st, now, obs)
	if err != nil {
		return res, err
	}
	if in.peerServes != nil {
		// The other writer's CA that signed here and that evercert's
		// successor replaced, here or at a peer (in.last), signs nothing
		// any more: it leaves once every leaf it signed has expired, as a
		// CA the trim kept for a served leaf does (foreignWriter.retireReplaced).
		var prev []*x509.Certificate
		if readSigning != nil {
			prev = append(prev, readSigning)
		}
		if in.last != nil && in.last.signing != nil {
			prev = append(prev, in.last.signing.Cert)
		}
		retiring = m.writer.retireReplaced(st, prev, now) || retiring
	}
	if unsafe {
		res.unsafe, res.unsafeWhy = true, fmt.Sprintf("no observed CA was valid any more at %s, so CA %q signs before every observer confirmed it",
			now.UTC().Format(time.RFC3339), st.signing.Cert.Subject.CommonName)
		if len(uncovered) > 0 {
			res.unsafeWhy += "; " + uncoveredWhy(st.signing.Cert, uncovered)
		}
	}
	// The record goes out with the write that lets the CA sign (or, for a
	// hand promotion, with the first write after it): whoever reads the
	// Secret counts it, whether or not this replica lives to.
	recorded := res.unsafe && st.signing != nil && st.unsafe.add(now, Fingerprint(st.signing.Cert), res.unsafeWhy)
	res.write = changed || acted || res.restored || retiring || retired || in.adopted || len(res.repairs) > 0 || recorded || copied
	res.declarationOnly = declared && !res.write
	res.write = res.write || declared
	return res, nil
}

// handPromoted says why st's signing CA signs before any replica could
// have promoted it: it is the successor this process knew, and its minimum
// delay from the publication recorded in the Secret has not passed on this
// clock by more than three skew tolerances (a promoting replica's clock,
// the publisher's and this one may each be off by one). Only a hand edit
// does that (tls.crt set to the successor); it is not undone, since a
// replica that promoted it after this one stopped being live (a pause, a
// partition) looks the same from here, and undoing it would make the two
// undo each other. It is counted as an unsafe rotation instead: clients
// that follow the bundle with a lag up to the delay may not trust it yet.
// An emergency's successor signs without the delay by design.
func (m *machine) handPromoted(st, last *caSet, now time.Time) string {
	if last == nil || last.next == nil || last.signing == nil || st.signing == nil ||
		!st.signing.Cert.Equal(last.next.Cert) || last.signing.Cert.Equal(st.signing.Cert) ||
		st.ops.successor == Fingerprint(st.signing.Cert) || last.emergencyActive() || last.nextSince.IsZero() {
		return ""
	}
	allowed := last.nextSince.Add(m.sched.propagation - 3*m.sched.skew)
	if !now.Before(allowed) || !m.sched.valid(last.signing.Cert, now) {
		return ""
	}
	return fmt.Sprintf("CA %q, published at %s, signs at %s, before its minimum propagation delay (%v) could have passed on any replica: the Secret was edited by hand to promote it",
		st.signing.Cert.Subject.CommonName, last.nextSince.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), m.sched.propagation)
}

// handCopied handles the waiting successor found in tls.crt too: copied
// there by hand (or a restored backup), since a promotion by a replica
// moves it and never leaves it in both places. It signs from now on, as
// the operator asked, and the state is written back with it as the signing
// CA only; reported true. If an observer or a live replica did not hold it
// yet, that is an unsafe rotation, and why says so (the simulator, wider
// set, seed 3561: the copy signed unobserved and uncounted while the only
// publisher was down).
func (m *machine) handCopied(st *caSet, obs observation) (bool, string) {
	if st.next == nil || st.signing == nil || !st.signing.Cert.Equal(st.next.Cert) {
		return false, ""
	}
	ca := st.next.Cert
	st.next, st.nextSince, st.seenSince, st.inherited = nil, time.Time{}, time.Time{}, false
	if obs.all == nil || obs.all(ca) {
		return true, ""
	}
	return true, fmt.Sprintf("CA %q, a successor waiting for its observers, was copied into %s by hand: it signs before every observer confirmed it",
		ca.Subject.CommonName, "tls.crt")
}

// phase is where st stands at now; skew and broken are why this replica
// holds (RotationStatus.ClockSkew, Broken), "" when it does not.
func (m *machine) phase(st *caSet, now time.Time, skew, broken string) Phase {
	switch {
	case skew != "":
		return PhaseSuspect
	case broken != "":
		return PhaseBroken
	case st == nil || st.signing == nil:
		return PhaseStarting
	case st.emergencyActive():
		return PhaseEmergency
	case m.stalled(st, now):
		return PhaseStalled
	case st.next == nil:
		return PhaseSigning
	case now.Before(m.sched.signsNoEarlierThan(st)):
		return PhaseSuccessorPublished
	default:
		return PhaseSuccessorObserving
	}
}

// stalled reports whether the signing CA is within the leaf renew-before of
// its end: its leaves are cut short, and a successor should sign by now.
func (m *machine) stalled(st *caSet, now time.Time) bool {
	return !now.Before(st.signing.Cert.NotAfter.Add(-m.sched.leafRenewBefore))
}

// announced is what a replica announces it trusts (its Lease) while st is
// in force: every CA of the bundle its own observers confirmed, a
// successor that arrived here late marked DelayedCAPrefix until its
// minimum delay on this replica's clock has passed. The consumers of this replica's bundle that evercert
// cannot see need as long as anyone's. Not in an emergency (see
// Config.PropagationDelay). A process that found the successor
// published when it started announces it at once: it did not arrive late
// here, the delay runs from its publication (rotation.delayStart) and is
// kept by whichever replica promotes; waiting for a delay that every restart
// starts over would hold the successor back for good (issue 27).
func (m *machine) announced(st *caSet, now time.Time, locallyObserved func(*x509.Certificate) bool) []string {
	var trusted []string
	for _, c := range st.bundle {
		if !locallyObserved(c) {
			continue
		}
		if st.next != nil && c.Equal(st.next.Cert) && !st.inherited && now.Before(m.sched.signsNoEarlierThan(st)) && !st.emergencyActive() {
			trusted = append(trusted, DelayedCAPrefix+Fingerprint(c))
			continue
		}
		trusted = append(trusted, Fingerprint(c))
	}
	return trusted
}

// restore merges the last state this replica had in force into st, when st
// lost some of it: the Secret was deleted, or rolled back to older content.
// CAs that clients may trust come back into the bundle, and the newest CA
// that signed keeps signing, so no client loses trust. It reports whether
// st changed. keep, when not nil, limits the CAs brought back into the
// bundle to those: an adoption after another writer's rewrites
// (foreignWriter) keeps what a served leaf needs, not every CA this
// replica ever knew.
func (m *machine) restore(st *caSet, last *caSet, exists bool, now time.Time, keep []*x509.Certificate, served func(*x509.Certificate) bool) bool {
	if last == nil {
		return false
	}
	skew := m.sched.skew
	// A CA that expires within the skew tolerance may have left on
	// schedule, on a replica whose clock is ahead: it is not lost, and
	// writing it back would flip ca.crt with that replica until our clock
	// catches up.
	// A CA past its recorded retirement (retire.go), on the Secret as read
	// or as this process last had it, left on schedule too, unless a
	// served leaf still chains to it (machine.retire keeps it then).
	// An anchor this process knows is trusted until it expires, whatever
	// retirement a peer that does not know it recorded (machine.retire).
	trusted := func(c *x509.Certificate) bool {
		end := earliest(st.trustEnds(c), last.trustEnds(c))
		return now.Add(skew).Before(c.NotAfter) && (now.Add(skew).Before(end) || served(c) || m.writer.anchored(c)) && !m.emerg.compromised(st.ops, c)
	}
	// The Secret went back in time when its signing CA is older than ours
	// and either one we knew (a restore brings back what was there before)
	// or no longer valid. A valid CA we never saw is another writer's: a
	// replica whose clock is behind ours by more than the tolerance made it
	// because ours is not yet valid on its clock. Taking that for a
	// rollback would make the two replace each other's CA at API latency,
	// adding a CA to ca.crt on every round.
	rolledBack := func(c *pki.Issued) bool {
		if last.next != nil && c.Cert.Equal(last.next.Cert) {
			// Our successor, promoted: forward. Its NotBefore may be the
			// older one (it is backdated by the skew tolerance; an adopted
			// CA may not be backdated at all). Any other CA is judged as
			// below, also one with a key replacing a CA adopted without
			// its key: a backup restored mid-adoption is a rollback.
			return false
		}
		// A CA this process trimmed after another writer's rewrites is
		// known too: the clients were given the bundle without it, so a
		// backup from the overlap that brings it back must not make it
		// sign (foreignWriter.trim).
		known := slices.ContainsFunc(last.bundle, c.Cert.Equal) || m.writer.wasTrimmed(c.Cert, now)
		valid := !now.Add(skew).Before(c.Cert.NotBefore) && now.Before(c.Cert.NotAfter)
		// A CA this process knows compromised is no other writer's: it
		// left the bundle in an emergency, and a backup from before the
		// mark brought it back (a review found it signing again, the
		// mark gone with the backup's annotations).
		return last.signing.Cert.NotBefore.After(c.Cert.NotBefore) && (known || !valid || m.emerg.compromised(st.ops, c.Cert))
	}
	wentBack := last.signing != nil && (st.signing == nil || rolledBack(st.signing))
	// A CA known compromised whose leaves live replicas still serve is
	// written back too when the Secret went back in time, to be drained
	// once they are re-issued (drain): else clients would fail those
	// leaves at once (a review found a backup from before the first of
	// two marks leaving every replica serving leaves of a CA no bundle
	// held). Only then: a peer that drained it, its view of who serves
	// what ahead of ours, would otherwise meet it written back at every
	// round (the simulator found that hot loop, seed 190).
	trust := func(c *x509.Certificate) bool {
		return trusted(c) || wentBack && now.Add(skew).Before(c.NotAfter) && m.emerg.served(c)
	}
	from := last.bundle
	if keep != nil {
		from = keep
	}
	restored := false
	for _, c := range from {
		if trust(c) && !slices.ContainsFunc(st.bundle, c.Equal) {
			st.bundle, restored = append(st.bundle, c), true
		}
	}
	if restored {
		// Only a bundle that is written back is reordered: a replica that
		// holds ca.crt in another order than the Secret publishes other
		// bytes (caBundle, bundle file, its announced hash) than its peers.
		slices.SortStableFunc(st.bundle, func(a, b *x509.Certificate) int { return a.NotBefore.Compare(b.NotBefore) })
	}
	if last.signing != nil && trusted(last.signing.Cert) && wentBack {
		// Ours is newer: the Secret went back in time. (A successor that
		// another replica promoted is newer than ours and wins: rolledBack
		// is false for it.) Our signing CA found waiting as the successor
		// is a backup from before its promotion: its leaves are served, so
		// it signs again rather than wait, or be dropped as a successor
		// that signed nothing (a review found an emergency doing that).
		st.signing, st.legacy, restored = last.signing, last.legacy, true
		if st.next != nil && st.next.Cert.Equal(st.signing.Cert) {
			st.next, st.nextSince, st.seenSince, st.inherited = nil, time.Time{}, time.Time{}, false
		}
	}
	// Not after another writer's rewrites (keep): the CA adopted then is
	// newer than anything this replica published, and a successor of
	// its own is published on its schedule.
	if keep == nil && st.next == nil && last.next != nil && trusted(last.next.Cert) && st.signing != nil &&
		(last.signing != nil && st.signing.Cert.Equal(last.signing.Cert) || last.next.Cert.NotBefore.After(st.signing.Cert.NotBefore)) {
		// Our successor was lost, unless the Secret's signing CA is newer
		// than it. Under the CA it was published for, it is lost whatever
		// the NotBefores (an adopted CA is not backdated, the successor is).
		st.next, st.nextSince, st.seenSince, st.inherited, restored = last.next, last.nextSince, last.seenSince, last.inherited, true
	}
	if restored && last.unsafe.count > st.unsafe.count {
		// The record went back with the CAs (a delete, a backup): the
		// unsafe rotations this replica knew of happened all the same.
		st.unsafe = last.unsafe
	}
	if restored {
		// So did the caBundle target declarations: without them, while
		// their publishers are down, a successor would sign unobserved by
		// their targets (S1). declareTargets drops the ones that lapsed.
		st.targets = mergeDeclaredTargets(st.targets, last.targets)
	}
	if restored {
		why := "rolled back to older content"
		switch {
		case keep != nil:
			why = "adopted after another writer's rewrites"
		case !exists:
			why = "deleted"
		}
		// The signing CA may be missing still: one this replica knew
		// that is marked compromised, or ends within the tolerance, is not
		// written back (the simulator found the nil dereference here).
		signing := ""
		if st.signing != nil {
			signing = serial(st.signing.Cert)
		}
		klog.Background().Info("CA secret was "+why+"; writing back the CAs this replica knows so clients keep their trust",
			"provider", m.sched.name, "signingSerial", signing, "bundleSize", len(st.bundle))
	}
	return restored
}
