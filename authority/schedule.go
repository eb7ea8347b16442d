package authority

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/pki"
)

// rotation is the CA and leaf schedule of the issuer that SelfSigned (state
// in memory) and Authority (state in a Secret) share. Its decisions depend
// only on the state, the time and what the observers confirmed, so replicas
// reading the same Secret agree on them.
type rotation struct {
	name string
	// caKeyType is the key type of new CAs (see caKeyType).
	caKeyType                    pki.KeyType
	caLifetime, caRenewBefore    time.Duration
	propagation, leafRenewBefore time.Duration
	// skew is the clock skew tolerated between the processes sharing the
	// state: certificates are backdated by it, and a CA that is not yet
	// valid by less than it is accepted.
	skew time.Duration
	// caKeys, when set, holds the keys of new CAs (Config.CAKeys).
	caKeys *caKeys
}

// caSet is the CA side of the state: the CA that signs, a successor already
// published in the bundle but not signing yet, and every CA clients should
// still trust.
type caSet struct {
	signing *pki.Issued
	next    *pki.Issued
	// recorded are the CAs of WrittenBundleAnnotation in a Secret
	// rewritten since the Authority's last write (recordedBundle): a
	// peer's announced leaf may chain to one (replicaSet.setRoots), and a
	// process with no state in force trusts those a peer serves
	// (trustRecorded). Read only, never written as such.
	recorded []*x509.Certificate
	// skewHeld: the Secret as read, kept in force while this process's
	// clock was in doubt (a clock skew hold, Authority only): nothing of
	// it was decided by this process, so the next step still takes what
	// a process with no state in force takes (trustRecorded).
	skewHeld  bool
	nextSince time.Time // when next joined the bundle, on the publisher's clock
	// seenSince is when this process first saw next, on its own clock: it
	// is not stored, each process keeps its own. The minimum delay runs
	// from it, or, when inherited, from the recorded publication (see
	// delayStart).
	seenSince time.Time
	// inherited: next was already in the state when this process first
	// read it (a replica started, or restarted, after the publication), so
	// seenSince says when the process started, not when next arrived.
	inherited bool
	// signingSince is when this process's bundle first held the signing
	// CA (as successor or signing), on its own clock; zero when this
	// process started with it (its consumers read the bundle at start).
	// Not stored. See leafDue.
	signingSince time.Time
	bundle       []*x509.Certificate // oldest first
	// legacy is another rotator's serving leaf, served while the signing
	// CA was adopted without its key (SecretLayout knative): signing.Key
	// is nil then, and the successor, published at once, replaces both
	// once observed.
	legacy *pki.Issued
	// ops are the operator's requests (Authority only; see emergency.go).
	ops operatorRequests
	// unsafe is the record of unsafe rotations kept in the Secret
	// (Authority only; see unsafe_record.go).
	unsafe unsafeRecord
	// replicaNames are the leaf names the replicas sharing the Secret
	// announce (Authority only; see replica_names.go).
	replicaNames []string
	// targets are the caBundle targets declared by the replicas that
	// publish (Authority only; see declared_targets.go).
	targets []declaredTarget
	// retire records when CAs of the bundle leave it before they expire
	// (RetireAfterAnnotation; see retire.go). Shared between clones:
	// replaced, never changed in place.
	retire retirements
}

// signingEnds is when the signing CA stops being able to serve: its
// NotAfter, or for a CA adopted without its key, which serves only the
// other tool's leaf, that leaf's NotAfter when it comes first.
func (cs *caSet) signingEnds() time.Time {
	end := cs.signing.Cert.NotAfter
	if cs.signing.Key == nil && cs.legacy != nil && cs.legacy.Cert.NotAfter.Before(end) {
		end = cs.legacy.Cert.NotAfter
	}
	return end
}

func (cs *caSet) clone() caSet {
	c := *cs
	c.bundle = slices.Clone(cs.bundle)
	return c
}

// advance moves cs along the observed-rotation schedule at now and reports
// whether it changed and whether the change was an unsafe rotation:
//
//   - publish: caRenewBefore ahead of the signing CA's expiry a successor is
//     made and joins the bundle;
//   - observe: the successor signs only once observed(successor) holds and
//     the minimum propagation delay has passed since it was published;
//   - retire: expired CAs leave the bundle; the old CA stays until then.
//
// After a pause the signing CA keeps signing while it is valid, and its
// leaves are capped at its NotAfter. Only when it is no longer valid does a
// successor sign unobserved, or, with no valid successor, a fresh CA: an
// unsafe rotation. The very first CA is not one: nobody trusts anything yet.
//
// "No longer valid" here is on this process's clock alone. An Authority
// never gets here with a CA that is not yet valid on its clock, or that
// has expired for it but not for most of the live replicas: its Secret
// store refuses to decide on such a state (Authority.clockSkew), since a
// lagging or leading clock would replace the CA every replica's clients
// trust. SelfSigned has no other clock to ask.
func (r rotation) advance(cs *caSet, now time.Time, obs observation) (changed, unsafe bool, err error) {
	if cs.next != nil && !now.Before(cs.next.Cert.NotAfter) {
		cs.next, changed = nil, true // expired before it ever signed
	}
	switch {
	case cs.signing == nil && cs.next == nil && len(cs.bundle) == 0:
		ca, err := r.newCA(now)
		if err != nil {
			return false, false, fmt.Errorf("making CA: %w", err)
		}
		cs.signing, changed = ca, true
		klog.Background().Info("Created signing CA", "provider", r.name, "ca", ca.Cert.Subject.CommonName, "serial", serial(ca.Cert), "notAfter", ca.Cert.NotAfter.UTC())
	case cs.signing == nil || !r.valid(cs.signing.Cert, now) || !now.Before(cs.signingEnds()):
		if cs.next != nil && r.valid(cs.next.Cert, now) {
			// No choice is left; the question is only whether clients can
			// have it: its minimum delay passed here, this process's own
			// observers hold it, and no live replica announces it lacks
			// it. Stale announcements (after a pause, until renewed) are
			// not asked.
			unsafe = now.Before(r.signsNoEarlierThan(cs)) || !obs.local(cs.next.Cert) || obs.lacking != nil && obs.lacking(cs.next.Cert)
			cs.signing, cs.next, changed = cs.next, nil, true
		} else {
			ca, err := r.newCA(now)
			if err != nil {
				return false, false, fmt.Errorf("making CA: %w", err)
			}
			cs.signing, cs.next, changed, unsafe = ca, nil, true, true
		}
		klog.Background().Info("Signing CA replaced after the previous one stopped being valid", "provider", r.name,
			"ca", cs.signing.Cert.Subject.CommonName, "serial", serial(cs.signing.Cert), "unsafe", unsafe)
	default:
		// A CA adopted without its key cannot sign: its successor is due
		// at once.
		// So is the successor of a CA whose key is in the Secret while the
		// keys belong in a key store.
		if cs.next == nil && (cs.signing.Key == nil || r.caKeys != nil && cs.signing.KeyRef == "" ||
			!now.Before(cs.signing.Cert.NotAfter.Add(-r.caRenewBefore))) {
			ca, err := r.newCA(now)
			if err != nil {
				return false, false, fmt.Errorf("making successor CA: %w", err)
			}
			cs.next, cs.nextSince, cs.seenSince, cs.inherited, changed = ca, now, now, false, true
			klog.Background().Info("Published successor CA; it signs once every observer has it", "provider", r.name,
				"ca", ca.Cert.Subject.CommonName, "serial", serial(ca.Cert), "signsNoEarlierThan", r.signsNoEarlierThan(cs).UTC())
		}
		if cs.next != nil && r.promotable(cs, now, obs.all) {
			cs.signing, cs.next, changed = cs.next, nil, true
			cs.signingSince = cs.seenSince
			if cs.inherited {
				cs.signingSince = time.Time{} // its consumers had it from the start
			}
			klog.Background().Info("Successor CA observed; it signs now", "provider", r.name, "ca", cs.signing.Cert.Subject.CommonName, "serial", serial(cs.signing.Cert))
		}
	}
	if cs.signing != nil && cs.signing.Key != nil {
		cs.legacy = nil // a CA of ours signs: the other tool's leaf is done
	}
	for _, ca := range []*pki.Issued{cs.signing, cs.next} {
		if ca != nil && !slices.ContainsFunc(cs.bundle, ca.Cert.Equal) {
			cs.bundle, changed = append(cs.bundle, ca.Cert), true
		}
	}
	kept := slices.DeleteFunc(slices.Clone(cs.bundle), func(c *x509.Certificate) bool { return !now.Before(c.NotAfter) })
	if len(kept) != len(cs.bundle) {
		cs.bundle, changed = kept, true
	}
	return changed, unsafe, nil
}

// observation is what advance asks of the observers.
type observation struct {
	// all: every observer and every live replica confirmed the CA; needed
	// to promote a successor while the signing CA is still valid.
	all func(*x509.Certificate) bool
	// local: this process's own observers confirmed it; enough to call a
	// promotion forced by the signing CA's end safe.
	local func(*x509.Certificate) bool
	// lacking, when set, reports whether a live replica whose
	// announcement is current does not hold the CA.
	lacking func(*x509.Certificate) bool
	// blind, when set, says why all cannot see the other replicas (their
	// Leases cannot be listed): all then confirms on this process's own
	// observers alone. Nil or "" when it can.
	blind func() string
	// covered, when set, returns the caBundle targets that live replicas'
	// believed announcements name and that trust the CA, this process's
	// own included (replicaSet.covering).
	covered func(*x509.Certificate) []string
	// uncovered is set by step from covered and the targets declared in
	// the state (machine.uncoveredTargets): all already includes it; an
	// emergency, which does not wait for them, counts them unsafe.
	uncovered func(*x509.Certificate) []string
}

// promotable reports whether the successor may sign: its minimum delay has
// passed and every observer confirmed it.
func (r rotation) promotable(cs *caSet, now time.Time, observed func(*x509.Certificate) bool) bool {
	return !now.Before(r.signsNoEarlierThan(cs)) && (observed(cs.next.Cert) || mutations.ignoreObservers)
}

// signsNoEarlierThan is when the successor's minimum propagation delay
// ends: PropagationDelay after delayStart.
func (r rotation) signsNoEarlierThan(cs *caSet) time.Time {
	return r.delayStart(cs).Add(r.propagation)
}

// delayStart is when the successor's minimum delay starts on this
// process's clock.
//
// A process that saw the successor arrive measures from then, on its own
// clock (seenSince), as before: clock skew never shortens the delay, and a
// replica that read the successor late (a slow watch) gives its own
// consumers as long as anyone's.
//
// A process that found the successor already published when it started
// (inherited) measures from the publication recorded in the Secret
// (nextSince, on the publisher's clock), moved later by twice the skew
// tolerance, and never later than its own start: otherwise every restart
// would start the delay over, and a Deployment rolled out, or a pod
// restarted, more often than the delay would never let a successor sign
// while the old CA is valid (issue 27). The margin is added because the
// publisher's clock may be behind this one: taken at face value its time
// would end the delay early in real time by as much. Twice the tolerance
// covers two clocks each off by up to the tolerance in opposite
// directions (the tolerance is what each is backdated for), so the delay
// is never shortened by such skew; it costs at most that much more wait
// when no replica that saw the publication is left. A publication time in
// this clock's future (a publisher whose clock is ahead) changes nothing:
// this process's own start, which came after the real publication, is
// the earlier bound then. A publication beyond the tolerance in this
// clock's future is a clock skew (Authority.clockSkew) and nothing is
// decided on it. An unknown publication time (a stripped or garbled
// annotation) leaves seenSince.
func (r rotation) delayStart(cs *caSet) time.Time {
	start := cs.seenSince
	if cs.inherited && !cs.nextSince.IsZero() {
		start = earliest(start, cs.nextSince.Add(2*r.skew))
	}
	return start
}

// valid reports whether c is valid at now, accepting a certificate that is
// not yet valid by less than the skew tolerance: another replica whose clock
// is ahead may have made it.
func (r rotation) valid(c *x509.Certificate, now time.Time) bool {
	return !now.Add(r.skew).Before(c.NotBefore) && now.Before(c.NotAfter)
}

// newCA makes a CA named "<provider>-ca@<unix seconds>", as upstream names
// its self-signed CAs, so that logs, Status and x509 errors say which CA.
func (r rotation) newCA(now time.Time) (*pki.Issued, error) {
	req := pki.Request{CommonName: caCommonName(r.name, now), KeyType: r.caKeyType, Now: now, Lifetime: r.caLifetime, Backdate: r.backdate()}
	if r.caKeys != nil {
		key, ref, err := r.caKeys.newKey(r.caKeyType)
		if err != nil {
			return nil, err
		}
		req.Key, req.KeyRef = key, ref
	}
	return pki.NewCA(req)
}

// caCommonName is the common name of a CA that provider makes at now.
func caCommonName(provider string, now time.Time) string {
	return fmt.Sprintf("%s-ca@%d", provider, now.Unix())
}

// backdate is how far certificates are backdated: the skew tolerance, and
// never less than pki's default.
func (r rotation) backdate() time.Duration { return max(r.skew, pki.ClockSkew) }

// leafDue reports whether leaf, signed by the CA whose raw certificate is
// signedBy, must be re-issued at now: there is none, its CA no longer signs,
// the clock went back before its NotBefore, or it is within leafRenewBefore
// of expiry. A leaf capped at its CA's expiry cannot get longer by re-signing
// with the same CA, so only a CA change renews it and this never spins.
func (r rotation) leafDue(leaf *pki.Issued, signedBy []byte, cs *caSet, now time.Time) bool {
	if leaf != nil && now.Before(cs.signing.Cert.NotBefore) && !now.Before(leaf.Cert.NotBefore) && now.Before(leaf.Cert.NotAfter) {
		// The signing CA is accepted within the skew tolerance but is not
		// valid yet on this clock (a replica whose clock is ahead made
		// it): a leaf signed now would not be valid here either, and this
		// process would serve and announce a leaf its own TLS stack
		// rejects. Keep the current, valid leaf until the CA is valid;
		// nextDeadline wakes up then.
		return false
	}
	if leaf != nil && !bytes.Equal(signedBy, cs.signing.Cert.Raw) && r.keepOldLeaf(leaf, signedBy, cs, now) {
		return false
	}
	switch {
	case leaf == nil, !bytes.Equal(signedBy, cs.signing.Cert.Raw), now.Add(r.skew).Before(leaf.Cert.NotBefore):
		return true
	}
	return !now.Before(leaf.Cert.NotAfter.Add(-r.leafRenewBefore)) && leaf.Cert.NotAfter.Before(cs.signing.Cert.NotAfter)
}

// keepOldLeaf reports whether this process keeps serving leaf, signed by
// the CA whose raw certificate is signedBy, although another CA signs now:
// the signing CA reached this process's bundle less than the propagation
// delay ago (signingSince: it was paused, or cut off, while the others
// promoted it without waiting for it), so the consumers of its bundle may
// not have it yet. The old CA still serves them: it is still in the bundle,
// valid, not marked compromised, and the leaf is not due on its own. The
// simulator found it (issue 28).
func (r rotation) keepOldLeaf(leaf *pki.Issued, signedBy []byte, cs *caSet, now time.Time) bool {
	if cs.signingSince.IsZero() || !now.Before(cs.signingSince.Add(r.propagation)) || mutations.serveAtOnce {
		return false
	}
	if !now.Before(leaf.Cert.NotAfter.Add(-r.leafRenewBefore)) || now.Before(leaf.Cert.NotBefore) {
		return false
	}
	i := slices.IndexFunc(cs.bundle, func(c *x509.Certificate) bool { return bytes.Equal(c.Raw, signedBy) })
	if i < 0 || !r.valid(cs.bundle[i], now) {
		return false
	}
	fp := Fingerprint(cs.bundle[i])
	return !cs.ops.marks(fp)
}

// nextDeadline is the earliest time after now at which advance or leafDue
// will decide differently on the clock alone.
func (r rotation) nextDeadline(cs *caSet, leaf *x509.Certificate, now time.Time) time.Time {
	next := cs.signing.Cert.NotAfter
	if leaf.NotAfter.Before(next) {
		next = leaf.NotAfter.Add(-r.leafRenewBefore)
	}
	if cs.next == nil {
		next = earliest(next, cs.signing.Cert.NotAfter.Add(-r.caRenewBefore))
	} else if signs := r.signsNoEarlierThan(cs); signs.After(now) {
		// Once the minimum delay is over, only observers hold the
		// successor back: they notify, and are polled every check
		// interval. A deadline in the past would be a busy loop.
		next = earliest(next, signs)
	}
	for _, c := range cs.bundle {
		next = earliest(next, c.NotAfter)
		if t, ok := cs.retire[Fingerprint(c)]; ok && t.After(now) {
			// Not once past: a CA a served leaf still needs stays
			// (machine.retire), and a deadline in the past would be a
			// busy loop.
			next = earliest(next, t)
		}
	}
	if cs.signing.Cert.NotBefore.After(now) {
		next = earliest(next, cs.signing.Cert.NotBefore) // see leafDue
	}
	if kept := cs.signingSince.Add(r.propagation); !cs.signingSince.IsZero() && kept.After(now) {
		next = earliest(next, kept) // see keepOldLeaf
	}
	return next
}

// issueLeaf signs a serving leaf with a new key of type kt for cfg's names
// with the signing CA, for issuedLifetime: as issued, it is never due before
// MinReissueInterval has passed.
func (r rotation) issueLeaf(cs *caSet, kt pki.KeyType, commonName string, dnsNames []string, ips []net.IP, lifetime time.Duration, now time.Time) (*pki.Issued, error) {
	issued, err := costly.issueLeaf(cs.signing, pki.Request{
		CommonName: commonName, DNSNames: dnsNames, IPs: ips,
		KeyType: kt, Now: now, Lifetime: r.issuedLifetime(now, lifetime), Backdate: r.backdate(),
	})
	if err != nil {
		return nil, fmt.Errorf("issuing %s leaf: %w", kt, err)
	}
	return issued, nil
}

// issuedLifetime is the lifetime to ask for at now. X.509 stores NotAfter in
// whole seconds and crypto/x509 truncates it, so a 1s leaf asked for at
// 12:00:00.9 ended at 12:00:01 and, with a renew-before of 1/3s, was due
// before it was issued: Run re-issued it at once, forever. When the
// truncated NotAfter leaves the leaf due within MinReissueInterval, it is
// rounded up to the next whole second instead, so the leaf lives at least
// lifetime and is never due at issue (renew-before < lifetime). Leaves of
// ordinary schedules, whose lifetime exceeds renew-before by 1.5s or more,
// are issued exactly as before.
func (r rotation) issuedLifetime(now time.Time, lifetime time.Duration) time.Duration {
	end := now.Add(lifetime)
	kept := end.Truncate(time.Second)
	if !kept.Add(-r.leafRenewBefore).Before(now.Add(MinReissueInterval)) || kept.Equal(end) {
		return lifetime
	}
	return kept.Add(time.Second).Sub(now)
}

// bundlePEM encodes the bundle, and a pool for verifying against it.
func (cs *caSet) bundlePEM() ([]byte, *x509.CertPool) {
	var b bytes.Buffer
	pool := x509.NewCertPool()
	for _, c := range cs.bundle {
		b.Write(pki.EncodeCertPEM(c.Raw))
		pool.AddCert(c)
	}
	return b.Bytes(), pool
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func serial(c *x509.Certificate) string { return c.SerialNumber.Text(16) }
