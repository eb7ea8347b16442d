package authority

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/server/healthz"

	"github.com/evercert/evercert/internal/certmetrics"
)

// RotationStatus is where an issuer (SelfSigned, Authority) stands in its
// CA rotation. Read it with Status; it is a copy the caller owns.
type RotationStatus struct {
	// Phase is where the rotation stands (see Phase); PhaseStarting before
	// the first check.
	Phase Phase
	// Signing is the CA that signs leaves now; zero before the first check.
	Signing CAStatus
	// Successor is the CA published in the bundle that waits for its
	// observers before it signs; nil when none waits.
	Successor *SuccessorStatus
	// Stalled is true when the signing CA is so close to expiry that leaves
	// are cut short (within the leaf renew-before of its NotAfter) and no
	// successor signs yet: an observer is not confirming, or (with no
	// Successor) the CA state cannot be read or written (see LastError).
	// An Authority replica that cannot read its CA Secret fresh (the
	// Secret's watch delivered nothing, no event and no bookmark, and no
	// read succeeded for the longer of its check interval and two minutes,
	// and the GET that replaces the watch fails) cannot see a change of the
	// Secret, such as a CA marked compromised: LastError then starts with
	// "stale watch" and the load-error metric counts it, but Stalled still
	// follows the schedule alone. A GET fails alike on every replica (an
	// outage, an RBAC change, a rotated token), and failing readiness on it
	// would empty the Service of every replica at once.
	Stalled bool
	// LeafExpired is true while the leaf this process serves has expired on
	// its clock and no new one is issued yet: after a pause longer than
	// the leaf's renew-before (a frozen VM, SIGSTOP), an Authority replica
	// first waits for the other replicas' next Lease renewals to tell
	// whether its clock agrees (up to a third of the lease duration)
	// before it signs again, and serves the expired leaf meanwhile; in an
	// emergency that an observer never confirms, the compromised CA signs
	// no new leaf and the last one runs out (Emergency says which
	// observers are pending). RotationCheck fails while it lasts, so no
	// client is sent to it.
	LeafExpired bool
	// CatchingUp is true while this replica serves a leaf of a signing CA
	// that reached its bundle less than the propagation delay ago, with no
	// leaf of the previous CA left to serve: it was paused, or cut off,
	// longer than its Lease while the other replicas promoted the CA
	// without it, or its container restarted in the same pod before its
	// previous process announced the CA (replicaSet.consumersMayLack). The
	// consumers of its bundle (a bundle file, clients that fetched it) may
	// not trust the CA yet, so RotationCheck fails until the delay has
	// passed on its clock; the other replicas, which promoted it, serve
	// meanwhile. Never for an emergency's successor, a new pod, or a
	// replica that cannot list the Leases.
	CatchingUp bool
	// UnsafeRotations counts the rotations since start in which a CA signed
	// before it was observed, because no observed CA was valid any more.
	UnsafeRotations int
	// RecordedUnsafeRotations, for an Authority, is the count of unsafe
	// rotations recorded in the CA Secret (UnsafeRotationsAnnotation) by
	// whichever replica made them, this one or another, running or not;
	// LastUnsafeRotation describes the last ("" when none).
	RecordedUnsafeRotations int
	LastUnsafeRotation      string
	// LastError is the last check's error, nil after a success.
	LastError error
	// ClockSkew, for an Authority replica, says why its clock disagrees
	// with the CA Secret or with the other replicas beyond the skew
	// tolerance; empty while it agrees. While it is set the replica does
	// not write the Secret and issues no leaf (see the package
	// documentation, "Observed rotation").
	ClockSkew string
	// Broken, for an Authority, says why its CA Secret cannot be used as
	// read (a hand edit: a part that does not parse, a signing CA that
	// ca.crt does not publish) and this replica cannot repair it, because
	// it does not hold what is missing (it started after the edit), or
	// cannot yet: it holds the repair but writes nothing until its clock is
	// checked (back from a pause, it waits for the other replicas' next
	// Lease renewals); empty otherwise. A replica that holds it writes it
	// back instead (Warning Event CASecretRepaired). Nothing rotates until someone repairs the
	// Secret; the replica keeps serving the leaf it has, if any, reports a
	// CertificateLoadFailed Event per episode and counts every failed
	// check. It does not fail readiness by itself: every replica reads the
	// same Secret, and failing them all would empty the Service while each
	// still serves a valid leaf. Stalled (and readiness) follow the
	// schedule: they turn on once the signing CA nears its end.
	Broken string
	// ForeignWriter, for an Authority that adopts another rotator's Secret
	// (Config.Adopt), says that the rotator keeps rewriting the Secret with
	// new CAs after this replica adopted or wrote it (the old pods of a
	// rolling update still run it), naming the Secret and the layout;
	// empty otherwise. Stalled is set while it lasts; the replica adopts
	// nothing, keeps serving what it has, sends a ForeignCASecretWriter
	// Warning Event per episode and counts each rewrite
	// (evercert_ca_secret_foreign_rewrites_total). RotationCheck stays
	// green for it while a valid leaf is served: the rolling update that
	// removes the old rotator's pods waits for the new pods to be Ready.
	// Once the Secret has held the same CA for a quiet period (one check
	// interval, doubling while the rotator answers each adoption with a
	// rewrite, up to ten) it is adopted once, keeping in ca.crt only the
	// CAs a served leaf needs; until that adoption is written (a write that
	// conflicts is retried) it says so, and Stalled stays set. An
	// operator's mark on the Secret ends the hold at once.
	ForeignWriter string
	// foreignWriterOnly: Stalled is set for ForeignWriter alone, which
	// RotationCheck does not fail on.
	foreignWriterOnly bool
	// LeaseForbidden, for an Authority replica, says that RBAC forbids
	// writing its own replica Lease, naming the Lease and the verb (create,
	// update, get on leases.coordination.k8s.io); empty once a write
	// succeeds. The other replicas cannot see its announcements and do not
	// wait for it, so a successor CA may sign before this replica's
	// clients trust it. evercert_replica_lease_writes_forbidden_total
	// counts every denied attempt. It does not fail RotationCheck: the
	// replicas share one ServiceAccount, so RBAC denies them all alike,
	// and failing readiness on it would empty the Service at once, while
	// the risk it reports comes only with the next promotion.
	LeaseForbidden string
	// Emergency, for an Authority whose CA Secret marks a CA compromised
	// (CompromisedCAAnnotation), is where the emergency rotation stands;
	// nil when none is marked. Its String is a one-line summary.
	Emergency *EmergencyStatus
}

// CAStatus describes one CA certificate.
type CAStatus struct {
	CommonName  string
	Serial      string
	Fingerprint string
	NotBefore   time.Time
	NotAfter    time.Time
}

// SuccessorStatus describes a published successor CA.
type SuccessorStatus struct {
	CAStatus
	// PublishedAt is when the successor joined the bundle, on the clock of
	// the process that published it.
	PublishedAt time.Time
	// SignsNoEarlierThan is when the minimum propagation delay, counted
	// from when this process first saw the successor, has passed.
	SignsNoEarlierThan time.Time
	// Pending names the observers that have not confirmed the successor
	// yet: local observers by name ("cabundle", "ca-bundle-file"), replicas
	// as "replica/<id>", and caBundle targets declared in the CA Secret
	// that no live replica confirms (CABundleTargetsAnnotation; their
	// publishers are down) as "cabundle/<target>". Empty once all have.
	Pending []string
}

func describeCA(c *x509.Certificate) CAStatus {
	return CAStatus{
		CommonName: c.Subject.CommonName, Serial: serial(c), Fingerprint: Fingerprint(c),
		NotBefore: c.NotBefore, NotAfter: c.NotAfter,
	}
}

// updateStatus recomputes the status and the pending-observers gauge.
func (i *issuer) updateStatus(st *caSet, now time.Time) {
	m := i.machine()
	s := RotationStatus{Signing: describeCA(st.signing.Cert), Phase: m.phase(st, now, "", "")}
	s.Stalled = m.stalled(st, now)
	pending, uncovered := 0, 0
	if st.next != nil {
		succ := &SuccessorStatus{
			CAStatus:           describeCA(st.next.Cert),
			PublishedAt:        st.nextSince,
			SignsNoEarlierThan: i.sched.signsNoEarlierThan(st),
			Pending:            i.pending(st.next.Cert),
		}
		if i.replicas != nil {
			// Declared caBundle targets no live replica covers: the
			// successor waits for them as for any observer (machine.step).
			targets := m.uncoveredTargets(st, st.next.Cert, i.covering)
			uncovered = len(targets)
			succ.Pending = append(succ.Pending, targets...)
		}
		pending = len(succ.Pending)
		s.Successor = succ
	}
	certmetrics.UncoveredTargets(i.cfg.name, uncovered)
	s.Emergency = i.emerg.status(st)
	i.mu.RLock()
	fromSigning := i.leaf != nil && bytes.Equal(i.leafCA, st.signing.Cert.Raw)
	// The leaf's CA may have stopped signing since (promoted past while
	// this replica caught up): what counts is when it reached this
	// replica's bundle.
	leafLate := i.leaf != nil && now.Before(i.leafCatchUpUntil)
	i.mu.RUnlock()
	s.CatchingUp = (leafLate || fromSigning && !st.signingSince.IsZero() && now.Before(st.signingSince.Add(i.sched.propagation))) && !mutations.serveAtOnce
	certmetrics.PendingObservers(i.cfg.name, pending)
	s.RecordedUnsafeRotations, s.LastUnsafeRotation = st.unsafe.count, st.unsafe.last
	// 0 for a SelfSigned, which has no Secret: the series exists for every
	// provider that can rotate unsafely, as unsafe_rotations_total does.
	certmetrics.RecordedUnsafeRotations(i.cfg.name, st.unsafe.count)
	i.mu.Lock()
	s.UnsafeRotations = i.unsafe
	i.status = s
	i.mu.Unlock()
}

// currentStatus returns a copy of the status with the last error.
func (i *issuer) currentStatus() RotationStatus {
	i.mu.RLock()
	s := i.status
	if s.Successor != nil {
		succ := *s.Successor
		succ.Pending = append([]string(nil), succ.Pending...)
		s.Successor = &succ
	}
	if s.Emergency != nil {
		e := *s.Emergency
		e.Serving = append([]string(nil), e.Serving...)
		s.Emergency = &e
	}
	i.mu.RUnlock()
	s.LastError = i.report.lastError()
	now := i.cfg.clock.Now()
	i.mu.RLock()
	s.ClockSkew = i.skew
	s.LeafExpired = i.leaf != nil && !now.Before(i.leaf.Cert.NotAfter)
	i.mu.RUnlock()
	if i.replicas != nil {
		s.LeaseForbidden = i.replicas.forbiddenLease()
	}
	switch {
	case s.ClockSkew != "":
		s.Phase = PhaseSuspect
	case s.Phase == "":
		s.Phase = PhaseStarting
	}
	return s
}

// lastErrorSuffix is "; last error: <err>", or "" without one.
func lastErrorSuffix(err error) string {
	if err == nil {
		return ""
	}
	return "; last error: " + err.Error()
}

// RotationReporter is what RotationCheck reads: SelfSigned and Authority.
type RotationReporter interface {
	Name() string
	Status() RotationStatus
}

// RotationCheck returns a health check named "ca-rotation:<provider name>"
// that fails while the rotation is stalled (the signing CA is about to
// expire and no successor signs yet), naming the pending observers or the
// error that keeps a successor from being published, while an
// Authority replica's clock is skewed (RotationStatus.ClockSkew), naming
// the skew, while the leaf served has expired (LeafExpired), and while a
// replica catches up with a CA promoted without it (CatchingUp). A stale
// read of the CA Secret, a broken Secret, another writer still rewriting
// an adopted Secret (ForeignWriter: Stalled, but the rolling update that
// stops it waits for this pod to be Ready) and Lease writes that RBAC
// forbids (LeaseForbidden) are reported
// in Status (LastError, Broken, LeaseForbidden), Events and metrics, not here: they hit
// every replica alike, and failing readiness on them would empty the
// Service while each replica still serves a valid leaf. It
// belongs on /readyz and /healthz, not /livez: a restart does not make an
// observer confirm or fix a clock.
func RotationCheck(r RotationReporter) healthz.HealthChecker {
	return healthz.NamedCheck("ca-rotation:"+r.Name(), func(*http.Request) error {
		s := r.Status()
		switch {
		case s.ClockSkew != "":
			return fmt.Errorf("clock skew: %s", s.ClockSkew)
		case s.CatchingUp:
			return fmt.Errorf("CA %s reached this replica's bundle less than the propagation delay ago (it was paused or cut off while the other replicas promoted it); its consumers may not trust it yet", s.Signing.Serial)
		case s.LeafExpired:
			return fmt.Errorf("the serving certificate has expired on this replica's clock and no new one is issued yet (phase %s%s)", s.Phase, lastErrorSuffix(s.LastError))
		case !s.Stalled || s.foreignWriterOnly:
			// A hold on another writer's rewrites (ForeignWriter) alone
			// does not fail: the rolling update that stops that writer
			// waits for this pod to be Ready.
			return nil
		case s.Successor != nil:
			return fmt.Errorf("successor CA %s waits for %s while CA %s expires at %s",
				s.Successor.Serial, strings.Join(s.Successor.Pending, ", "), s.Signing.Serial, s.Signing.NotAfter.UTC().Format(time.RFC3339))
		default:
			return fmt.Errorf("CA %s expires at %s and no successor could be published: %v",
				s.Signing.Serial, s.Signing.NotAfter.UTC().Format(time.RFC3339), s.LastError)
		}
	})
}
