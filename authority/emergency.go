package authority

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certreport"
)

// operatorRequests are the operator annotations of the CA Secret (see
// operator_annotations.go) as read, with the "-handled" ones as this
// replica's decision leaves them.
type operatorRequests struct {
	rotateRequested, rotateHandled          string
	compromised, reason, markedAt, cHandled string
	// successor and dropped are the Authority's own record of an emergency
	// (see emergency.decide): the successor made after the mark, and the
	// successors that were pending before it and were dropped.
	successor string
	dropped   []string
}

// pending reports whether the Secret, read as st, carries an operator's
// request not acted on yet or an emergency that is not over: a rotation
// requested and not handled, a compromised mark not handled (the
// emergency is done once the mark's CA left the Secret: cHandled) that
// names a CA of st or of last (the state this process has in force; nil
// before its first), or a dropped successor still in it. Such a Secret is evercert's state to act
// on at once, never a foreign writer's rewrite to hold
// (foreignWriter.rewritten). A handled request is not: the annotations stay
// on the Secret for good (the requests are the operator's, and the
// Authority never removes them), and the old rotator's Update keeps them,
// so counting them turned the hold off for the rest of an overlap once an
// operator had asked for anything (a review found ca.crt collecting one CA
// per rewrite again). Nor is a mark that names no CA of st or last: the
// emergency ignores it (decide: an Event, never recorded handled), and the
// old rotator's Update keeps it on the Secret too (an operator's typo, or
// a CA its rewrite replaced before any replica acted on the mark: the
// simulator found every later rewrite adopted at once).
func (o operatorRequests) pending(st, last *caSet) bool {
	if o.rotateRequested != "" && o.rotateRequested != o.rotateHandled {
		return true
	}
	if o.compromised != "" && o.compromised != o.cHandled && (st.holdsFingerprint(o.compromised) || last != nil && last.holdsFingerprint(o.compromised)) {
		return true
	}
	return slices.ContainsFunc(o.dropped, st.holdsFingerprint)
}

// marks reports whether the CA with Fingerprint fp is marked compromised
// or is a successor an emergency dropped: never trusted again, whether the
// mark is handled or not.
func (o operatorRequests) marks(fp string) bool {
	return fp == o.compromised || slices.Contains(o.dropped, fp)
}

// holdsFingerprint reports whether fp is the Fingerprint of cs's signing
// CA, its successor or a CA of its bundle.
func (cs *caSet) holdsFingerprint(fp string) bool {
	return cs.signing != nil && Fingerprint(cs.signing.Cert) == fp || cs.next != nil && Fingerprint(cs.next.Cert) == fp ||
		slices.ContainsFunc(cs.bundle, func(c *x509.Certificate) bool { return Fingerprint(c) == fp })
}

// Annotations the Authority keeps about an emergency rotation, beside the
// operator's: emergencySuccessorAnnotation is the Fingerprint of the
// successor made after the current mark; emergencyDroppedAnnotation lists
// (comma-separated) the CAs that must leave ca.crt although the mark does
// not name them: the successors that were pending when a signing CA was
// marked compromised (their keys were kept where the compromised CA's was:
// next.key beside tls.key, or the same key store, so they never sign and
// leave at once), and CAs marked compromised before the operator marked
// another. Every replica reads this list, so none signs with one or writes
// one back (machine.restore).
const (
	emergencySuccessorAnnotation = "evercert.io/compromised-successor"
	emergencyDroppedAnnotation   = "evercert.io/compromised-dropped-successors"
)

func parseOperatorRequests(s *corev1.Secret) operatorRequests {
	a := s.Annotations
	return operatorRequests{
		rotateRequested: a[RotateRequestedAnnotation], rotateHandled: a[RotateHandledAnnotation],
		compromised: a[CompromisedCAAnnotation], reason: a[CompromisedReasonAnnotation],
		markedAt: a[CompromisedAtAnnotation], cHandled: a[CompromisedHandledAnnotation],
		successor: a[emergencySuccessorAnnotation], dropped: splitList(a[emergencyDroppedAnnotation]),
	}
}

func splitList(v string) []string {
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// writeOperatorHandled records in s what the Authority acted on. The
// requests themselves are the operator's and are never touched.
func writeOperatorHandled(ops operatorRequests, s *corev1.Secret) {
	for k, v := range map[string]string{
		RotateHandledAnnotation: ops.rotateHandled, CompromisedHandledAnnotation: ops.cHandled,
		emergencySuccessorAnnotation: ops.successor, emergencyDroppedAnnotation: strings.Join(ops.dropped, ","),
	} {
		if v == "" {
			continue
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

// emergencyActive reports whether the signing CA is marked compromised (by
// the operator's mark, or in the Authority's dropped list: see
// emergency.decide) and not yet replaced: its successor then signs as soon
// as every observer confirms it, without the minimum propagation delay.
func (cs *caSet) emergencyActive() bool {
	if cs.signing == nil || cs.ops.compromised == "" && len(cs.ops.dropped) == 0 {
		return false
	}
	fp := Fingerprint(cs.signing.Cert)
	return cs.ops.compromised != cs.ops.cHandled && fp == cs.ops.compromised || slices.Contains(cs.ops.dropped, fp)
}

// emergency carries out the operator's requests on an Authority's CA
// Secret: a rotation now (RotateRequestedAnnotation) and the emergency
// rotation away from a compromised CA (CompromisedCAAnnotation):
//
//  1. published: a successor is made and joins ca.crt at once (a
//     compromised successor is dropped from ca.crt and replaced);
//  2. signing: the successor signs as soon as every observer and every live
//     replica confirmed it, without the minimum propagation delay;
//  3. reissued: every replica re-issues its leaf from it (each reads the
//     Secret), and SignLeaf refuses the compromised CA from the moment this
//     replica read the mark;
//  4. untrusted: the compromised CA leaves ca.crt as soon as no live
//     replica's Lease announces a leaf it signed, and
//     CompromisedHandledAnnotation records it.
//
// Each step is decided inside the Secret's read-decide-write (decide), so
// replicas converge through resourceVersion conflicts like any rotation,
// and reported (a Warning Event on the Secret, a metric, the log) by the
// replica whose write made it (flush). It is safe for concurrent use.
type emergency struct {
	name   string
	sched  rotation
	report *reporter // Events about the CA Secret
	// serving names the live replicas (this one included) that serve a
	// leaf signed by ca.
	serving func(ca *x509.Certificate) []string

	mu sync.Mutex
	// notes are the steps the last decide took; flush reports them once
	// the state they belong to is written.
	notes []emergencyNote
	// known are the fingerprints this process saw marked compromised: they
	// are never written back to ca.crt (secretStore.restore), never sign,
	// and leave ca.crt once unserved even after the mark moved on to
	// another CA (a second emergency).
	known map[string]bool
	// ignored is the last marked fingerprint that matched no CA, reported
	// once; reissued whether this replica's leaf already left the
	// compromised CA (reported once per mark).
	ignored, reissued string
}

type emergencyNote struct {
	step, eventType, reason, msg string
}

// Steps of an emergency rotation: the values of the step label of
// evercert_emergency_rotation_steps_total.
const (
	emergencyPublished = "published"
	emergencySigning   = "signing"
	emergencyReissued  = "reissued"
	emergencyUntrusted = "untrusted"
)

func newEmergency(name string, sched rotation, report *reporter, serving func(*x509.Certificate) []string) *emergency {
	return &emergency{name: name, sched: sched, report: report, serving: serving, known: map[string]bool{}}
}

// compromised reports whether c was marked compromised, by ops or earlier
// in this process.
func (e *emergency) compromised(ops operatorRequests, c *x509.Certificate) bool {
	if e == nil || c == nil {
		return false
	}
	e.mu.Lock()
	none := len(e.known) == 0
	e.mu.Unlock()
	if none && ops.compromised == "" && len(ops.dropped) == 0 {
		return false // no mark: the usual case, asked at every check
	}
	fp := Fingerprint(c)
	if ops.marks(fp) {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.known[fp]
}

// decide acts on the requests in cs at now, before the schedule advances:
// it reports whether cs changed. It runs inside the Secret's update, once
// per attempt; notes start afresh each time.
func (e *emergency) decide(cs *caSet, now time.Time, obs observation) (changed bool, unsafeWhy string, err error) {
	if e == nil {
		return false, "", nil
	}
	e.mu.Lock()
	e.notes = e.notes[:0]
	e.mu.Unlock()
	if cs.signing == nil {
		return false, "", nil // nothing to rotate yet; the schedule makes the first CA
	}
	if r := cs.ops.rotateRequested; r != "" && r != cs.ops.rotateHandled {
		if cs.next == nil {
			if err := e.publish(cs, now); err != nil {
				return false, "", err
			}
			e.note("", corev1.EventTypeNormal, dynamiccert.ReasonCARotationRequested, fmt.Sprintf("rotation requested at %s: successor CA %q published; it signs once every observer confirms it and its minimum propagation delay has passed", r, cs.next.Cert.Subject.CommonName))
		} else {
			e.note("", corev1.EventTypeNormal, dynamiccert.ReasonCARotationRequested, fmt.Sprintf("rotation requested at %s: successor CA %q is already published", r, cs.next.Cert.Subject.CommonName))
		}
		cs.ops.rotateHandled, changed = r, true
		certmetrics.OperatorRequest(e.name, "rotate", "handled")
	}
	fp := cs.ops.compromised
	// The dropped list is remembered as the marks are: a backup from
	// before the emergency takes it away with the annotations, and the
	// successor it dropped (its key sat where the compromised CA's did)
	// must not come back and sign (a review found it promoted).
	if len(cs.ops.dropped) > 0 {
		e.mu.Lock()
		for _, d := range cs.ops.dropped {
			e.known[d] = true
		}
		e.mu.Unlock()
	}
	// A CA this process read marked compromised that the mark no longer
	// names (the operator marked another before it left ca.crt) is
	// recorded with the dropped ones: a replica that never read its mark
	// (started since) would otherwise keep it in ca.crt and write it back
	// after those that know drain it, for as long as both run.
	for _, c := range cs.bundle {
		if cs.signing.Cert.Equal(c) || cs.next != nil && cs.next.Cert.Equal(c) {
			continue // signing, or waiting to: the mark decides (isSigning)
		}
		if k := Fingerprint(c); k != fp && e.knows(k) && !slices.Contains(cs.ops.dropped, k) {
			cs.ops.dropped, changed = append(slices.Clone(cs.ops.dropped), k), true
		}
	}
	if cs.next != nil && Fingerprint(cs.next.Cert) != fp && e.compromised(cs.ops, cs.next.Cert) {
		// A successor dropped in an emergency (its key sat where the
		// compromised CA's did) is back as the successor: pasted into the
		// Secret again, or a restored backup. It never signs: out again,
		// as when it was dropped (the simulator found one promoted, and
		// every replica refusing to sign with it: none ready).
		bad := cs.next.Cert
		cs.next, changed = nil, true
		cs.bundle = slices.DeleteFunc(cs.bundle, bad.Equal)
		e.note("", corev1.EventTypeWarning, dynamiccert.ReasonEmergencyCARotation, fmt.Sprintf("CA %s, dropped in an emergency, is back in the Secret as the successor (a hand edit or a restored backup): dropped again", short(Fingerprint(bad))))
	}
	// own: the CA replaced is one the Authority knows compromised, not the
	// operator's current mark.
	own := false
	if sfp := Fingerprint(cs.signing.Cert); sfp != fp && e.compromised(cs.ops, cs.signing.Cert) {
		// A CA known compromised signs again, its mark gone: a backup
		// from before the mark restored (its annotations with it), or a
		// hand edit. It is replaced as if marked, and recorded in the
		// Authority's dropped list rather than in the operator's mark,
		// which a tool that owns the annotations (GitOps) may take away
		// again (a review found such a restore signing with the CA).
		if !slices.Contains(cs.ops.dropped, sfp) {
			cs.ops.dropped, changed = append(slices.Clone(cs.ops.dropped), sfp), true
			e.note("", corev1.EventTypeWarning, dynamiccert.ReasonEmergencyCARotation, fmt.Sprintf("CA %s, known to be compromised, is the signing CA again without a mark (a backup from before the mark restored, or a hand edit): emergency rotation again", short(sfp)))
		}
		if fp != "" && fp != cs.ops.cHandled && cs.next != nil && Fingerprint(cs.next.Cert) == fp {
			// The operator marked the successor (the mark moved to the
			// one this emergency published): out of ca.crt at once, as
			// any marked successor, and a new one in its place (a review
			// found it promoted, the own branch having taken fp over).
			e.mu.Lock()
			e.known[fp] = true
			e.mu.Unlock()
			bad := cs.next.Cert
			cs.next, changed = nil, true
			cs.bundle = slices.DeleteFunc(cs.bundle, bad.Equal)
		}
		fp, own = sfp, true
	}
	if fp == "" {
		return changed, "", e.drain(cs, &changed)
	}
	isSigning := Fingerprint(cs.signing.Cert) == fp
	isNext := cs.next != nil && Fingerprint(cs.next.Cert) == fp
	inBundle := slices.ContainsFunc(cs.bundle, func(c *x509.Certificate) bool { return Fingerprint(c) == fp })
	if fp == cs.ops.cHandled && !own {
		// A handled mark is still the operator's word that the CA is
		// compromised: a replica started after the emergency learns it
		// here, so that a backup from before the mark, which takes the
		// mark away, is a rollback to it too (machine.restore).
		e.mu.Lock()
		e.known[fp] = true
		e.mu.Unlock()
		if !isSigning && !isNext && !inBundle {
			return changed, "", e.drain(cs, &changed)
		}
		// Handled, and back: pasted into the Secret again by hand or by a
		// restored backup. A compromised CA never signs or stays trusted
		// again, so the emergency runs again (the simulator found one
		// pasted back taken for a successor, promoted, and every replica
		// refusing to sign with it: none ready).
		cs.ops.cHandled, changed = "", true
		e.note("", corev1.EventTypeWarning, dynamiccert.ReasonEmergencyCARotation, fmt.Sprintf("CA %s, marked compromised and removed, is back in the Secret (a hand edit or a restored backup): emergency rotation again", short(fp)))
	}
	if !isSigning && !isNext && !inBundle {
		if !e.knows(fp) {
			e.mu.Lock()
			first := e.ignored != fp
			e.ignored = fp
			e.mu.Unlock()
			if first {
				certmetrics.OperatorRequest(e.name, "compromised", "ignored")
				e.note("", corev1.EventTypeWarning, dynamiccert.ReasonCARequestIgnored, fmt.Sprintf("annotation %s=%q matches no CA in the Secret (signing, successor or ca.crt); ignored", CompromisedCAAnnotation, fp))
			}
			return changed, "", e.drain(cs, &changed)
		}
	}
	first := !e.knows(fp)
	e.mu.Lock()
	e.known[fp] = true
	e.mu.Unlock()
	if first {
		certmetrics.OperatorRequest(e.name, "compromised", "handled")
		klog.Background().Info("CA marked compromised; emergency rotation", "provider", e.name, "fingerprint", fp, "reason", cs.ops.reason, "markedAt", cs.ops.markedAt)
	}
	if isNext {
		// A compromised successor never signs: out of ca.crt at once (no
		// leaf was ever signed by it), and a new one in its place.
		bad := cs.next.Cert
		cs.next, changed = nil, true
		cs.bundle = slices.DeleteFunc(cs.bundle, bad.Equal)
	}
	if isSigning && cs.next != nil && Fingerprint(cs.next.Cert) != cs.ops.successor {
		// A successor pending before the mark (on schedule, or on a rotate
		// request) had its key where the compromised CA's was: next.key
		// beside tls.key, or the same key store. Whoever took one may hold
		// the other, so it never signs: out of ca.crt at once (it signed
		// nothing) and recorded, so that no replica writes it back, and a
		// new one in its place (issue 21: "a successor is made").
		bad := cs.next.Cert
		cs.next, changed = nil, true
		cs.bundle = slices.DeleteFunc(cs.bundle, bad.Equal)
		cs.ops.dropped = append(slices.Clone(cs.ops.dropped), Fingerprint(bad))
	}
	if cs.next == nil && (isSigning || isNext) {
		if err := e.publish(cs, now); err != nil {
			return false, "", err
		}
		cs.ops.successor, changed = Fingerprint(cs.next.Cert), true
		e.note(emergencyPublished, corev1.EventTypeWarning, dynamiccert.ReasonEmergencyCARotation, fmt.Sprintf("CA %s marked compromised (%s): successor CA %q published; it signs as soon as every observer confirms it",
			short(fp), cs.ops.reason, cs.next.Cert.Subject.CommonName))
	}
	if isSigning && cs.next != nil && obs.all(cs.next.Cert) {
		// A replica that cannot see its peers confirms on its own
		// observers alone; an emergency does not wait for the view to
		// come back (the compromised CA must stop signing), so the
		// promotion is counted unsafe: the peers' consumers may not have
		// the successor yet.
		if obs.blind != nil {
			if why := obs.blind(); why != "" {
				unsafeWhy = fmt.Sprintf("emergency successor CA %q signs unconfirmed by the other replicas: %s", cs.next.Cert.Subject.CommonName, why)
			}
		}
		// Nor does it wait for a declared caBundle target that no live
		// replica covers (its publishers are all down): the same trade as
		// the delay's, a key an attacker may hold against consumers nobody
		// observes now. Counted unsafe and recorded, naming the targets.
		if obs.uncovered != nil {
			if targets := obs.uncovered(cs.next.Cert); len(targets) > 0 {
				unsafeWhy = strings.TrimPrefix(unsafeWhy+"; emergency: "+uncoveredWhy(cs.next.Cert, targets), "; ")
			}
		}
		old := cs.signing.Cert
		cs.signing, cs.next, changed = cs.next, nil, true
		cs.signingSince = time.Time{} // no delay in an emergency (keepOldLeaf)
		e.note(emergencySigning, corev1.EventTypeWarning, dynamiccert.ReasonEmergencyCARotation, fmt.Sprintf("successor CA %q signs in place of compromised CA %q; every replica re-issues its leaf",
			cs.signing.Cert.Subject.CommonName, old.Subject.CommonName))
	}
	return changed, unsafeWhy, e.drain(cs, &changed)
}

// drain removes from ca.crt every CA known to be compromised that neither
// signs nor waits to, once no live replica serves a leaf it signed, and
// records the mark handled once its CA is gone.
func (e *emergency) drain(cs *caSet, changed *bool) error {
	for _, c := range slices.Clone(cs.bundle) {
		if !e.compromised(cs.ops, c) || c.Equal(cs.signing.Cert) || (cs.next != nil && c.Equal(cs.next.Cert)) {
			continue
		}
		if len(e.serving(c)) > 0 {
			continue
		}
		cs.bundle = slices.DeleteFunc(cs.bundle, c.Equal)
		*changed = true
		e.note(emergencyUntrusted, corev1.EventTypeWarning, dynamiccert.ReasonEmergencyCARotation, fmt.Sprintf("compromised CA %q (%s) removed from %s: no live replica serves a leaf it signed",
			c.Subject.CommonName, short(Fingerprint(c)), dynamiccert.SecretCAKey))
	}
	fp := cs.ops.compromised
	if fp != "" && fp != cs.ops.cHandled && e.knows(fp) &&
		!slices.ContainsFunc(cs.bundle, func(c *x509.Certificate) bool { return Fingerprint(c) == fp }) &&
		Fingerprint(cs.signing.Cert) != fp && (cs.next == nil || Fingerprint(cs.next.Cert) != fp) {
		cs.ops.cHandled, *changed = fp, true
	}
	return nil
}

// served reports whether a live replica (this one included) serves a
// leaf c signed.
func (e *emergency) served(c *x509.Certificate) bool {
	return e != nil && len(e.serving(c)) > 0
}

func (e *emergency) knows(fp string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.known[fp]
}

func (e *emergency) publish(cs *caSet, now time.Time) error {
	ca, err := e.sched.newCA(now)
	if err != nil {
		return fmt.Errorf("making successor CA: %w", err)
	}
	cs.next, cs.nextSince, cs.seenSince, cs.inherited = ca, now, now, false
	return nil
}

func (e *emergency) note(step, eventType, reason, msg string) {
	e.mu.Lock()
	e.notes = append(e.notes, emergencyNote{step: step, eventType: eventType, reason: reason, msg: msg})
	e.mu.Unlock()
}

// flush reports the steps the last decide took, now that the state they
// belong to is in force (written, or found written), and this replica's
// own progress: its leaf no longer signed by a compromised CA. It reports
// whether that just happened (once per mark): the caller checks again at
// once, since this replica may have been the last to serve from it.
func (e *emergency) flush(st *caSet, leafCA *x509.Certificate, replicas *replicaSet) (reissued bool) {
	if e == nil {
		return false
	}
	if replicas != nil {
		draining := slices.ContainsFunc(st.bundle, func(c *x509.Certificate) bool { return e.compromised(st.ops, c) })
		replicas.mu.Lock()
		replicas.leafWatched = draining
		replicas.mu.Unlock()
	}
	e.mu.Lock()
	notes := slices.Clone(e.notes)
	e.notes = e.notes[:0]
	e.mu.Unlock()
	for _, n := range notes {
		e.report.Event(n.eventType, n.reason, certreport.ActionRotate, n.msg)
		if n.step != "" {
			certmetrics.EmergencyRotationStep(e.name, n.step)
		}
		klog.Background().Info("Emergency CA rotation", "provider", e.name, "step", n.step, "detail", n.msg)
	}
	trusted := slices.ContainsFunc(st.bundle, func(c *x509.Certificate) bool { return e.compromised(st.ops, c) })
	certmetrics.CompromisedCATrusted(e.name, trusted)
	if fp := st.ops.compromised; fp != "" && leafCA != nil && e.knows(fp) && Fingerprint(leafCA) != fp && !e.compromised(st.ops, leafCA) {
		e.mu.Lock()
		first := e.reissued != fp
		e.reissued = fp
		e.mu.Unlock()
		if first && fp != st.ops.cHandled {
			certmetrics.EmergencyRotationStep(e.name, emergencyReissued)
			e.report.Event(corev1.EventTypeWarning, dynamiccert.ReasonEmergencyCARotation, certreport.ActionRotate,
				fmt.Sprintf("this replica serves a leaf from CA %q, no longer from compromised CA %s", leafCA.Subject.CommonName, short(fp)))
			return true
		}
	}
	return false
}

// status describes the emergency for Status; nil when there is none.
func (e *emergency) status(st *caSet) *EmergencyStatus {
	if e == nil || st.ops.compromised == "" {
		return nil
	}
	s := &EmergencyStatus{Fingerprint: st.ops.compromised, Reason: st.ops.reason}
	s.MarkedAt, _ = time.Parse(time.RFC3339, st.ops.markedAt)
	var bad *x509.Certificate
	for _, c := range st.bundle {
		if Fingerprint(c) == st.ops.compromised {
			bad = c
		}
	}
	switch {
	case st.ops.cHandled == st.ops.compromised:
		s.Step = EmergencyDone
	case st.emergencyActive():
		s.Step = EmergencyWaitingForSuccessor // RotationStatus.Successor.Pending names what for
	case bad != nil && (st.next == nil || !bad.Equal(st.next.Cert)):
		s.Step = EmergencyDraining
		s.Serving = e.serving(bad)
	case !e.knows(st.ops.compromised):
		s.Step = EmergencyIgnored
	default:
		s.Step = EmergencyDraining
	}
	return s
}

// Steps of EmergencyStatus.
const (
	// EmergencyWaitingForSuccessor: the compromised CA still signs; its
	// successor is published and waits for its observers (no minimum
	// delay).
	EmergencyWaitingForSuccessor = "waiting-for-successor"
	// EmergencyDraining: the successor signs; the compromised CA stays in
	// ca.crt until no live replica serves a leaf it signed.
	EmergencyDraining = "draining"
	// EmergencyDone: the compromised CA is gone from ca.crt
	// (CompromisedHandledAnnotation is set).
	EmergencyDone = "done"
	// EmergencyIgnored: the fingerprint marked matches no CA in the
	// Secret; nothing was done.
	EmergencyIgnored = "ignored"
)

// EmergencyStatus is where an emergency rotation stands (RotationStatus).
type EmergencyStatus struct {
	// Fingerprint, Reason and MarkedAt are the operator's annotations.
	Fingerprint, Reason string
	MarkedAt            time.Time
	// Step is one of EmergencyWaitingForSuccessor, EmergencyDraining,
	// EmergencyDone, EmergencyIgnored.
	Step string
	// Serving names, while EmergencyDraining, the live replicas
	// ("replica/<id>", "self" for this one) still serving a leaf from the
	// compromised CA. While EmergencyWaitingForSuccessor,
	// RotationStatus.Successor.Pending names what the successor waits for.
	Serving []string
}

// String is the one-line summary Status shows.
func (s *EmergencyStatus) String() string {
	line := fmt.Sprintf("emergency rotation of CA %s (%s): %s", short(s.Fingerprint), s.Reason, s.Step)
	if len(s.Serving) > 0 {
		line += fmt.Sprintf(", waiting for %v", s.Serving)
	}
	return line
}

func short(fp string) string { return fp[:min(len(fp), 16)] }

// servingFrom names the live replicas whose Lease announces a leaf signed
// by ca, and this replica when its own leaf is.
func (i *issuer) servingFrom(ca *x509.Certificate) []string {
	var out []string
	i.mu.RLock()
	own := i.leaf != nil && signedBy(i.leaf.Cert, ca)
	i.mu.RUnlock()
	if own {
		out = append(out, "self")
	}
	if i.replicas != nil {
		out = append(out, i.replicas.servingFrom(ca)...)
	}
	return out
}

// servingFrom returns "replica/<id>" for every live replica whose
// announced leaf ca signed.
func (r *replicaSet) servingFrom(ca *x509.Certificate) []string {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	unseen := r.unseenLocked(now)
	var out []string
	if r.unlistedLocked(now) {
		out = append(out, unlistedPeers)
	}
	for _, l := range r.seen {
		if !l.deleted && r.waitedForLocked(l, now, unseen) && l.leaf != nil && signedBy(l.leaf, ca) {
			out = append(out, "replica/"+l.holder)
		}
	}
	slices.Sort(out)
	return out
}

// announces reports whether a Lease this process has seen, live or not,
// announces a leaf ca signed, or some peers' Leases cannot be listed
// (unlistedPeers). A replica cut off from the API server keeps renewing
// its leaf from the CA in its memory while its Lease expires: the Lease
// stays until its peers collect it (leaseGCAfter lease durations), and
// until then the trim after another writer's rewrites and a retirement
// keep the CA (foreignWriter.kept, machine.retire). A longer cut is not
// seen: the replica writes the CA back when it reads the Secret again
// (machine.restore).
func (r *replicaSet) announces(ca *x509.Certificate) bool {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unlistedLocked(now) {
		return true
	}
	for _, l := range r.seen {
		if !l.deleted && l.leaf != nil && signedBy(l.leaf, ca) {
			return true
		}
	}
	return false
}

func signedBy(leaf, ca *x509.Certificate) bool {
	return costly.signedBy(leaf, ca)
}

// currentLeafCA returns the CA that signed this replica's leaf, or nil.
func (i *issuer) currentLeafCA() *x509.Certificate {
	i.mu.RLock()
	raw := i.leafCA
	i.mu.RUnlock()
	if raw == nil {
		return nil
	}
	c, err := costly.parseCert(raw)
	if err != nil {
		return nil
	}
	return c
}

func sameLeaf(a, b *x509.Certificate) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}
