package authority

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/errlog"
	"github.com/evercert/evercert/internal/pki"
)

// issuer is what SelfSigned and Authority share: the CA schedule with
// observed rotation, this process's leaf, the observers, the status and the
// Run loop. They differ only in where the CA state lives (caStore) and in
// whether replicas announce themselves (replicas).
type issuer struct {
	listeners
	cfg      issuerConfig
	sched    rotation
	store    caStore
	replicas *replicaSet // nil without replica coordination
	emerg    *emergency  // operator requests; nil for SelfSigned
	// repair, judge and writer are the Authority's (see machine); nil for
	// SelfSigned.
	repair *secretRepair
	judge  func(st *caSet, now time.Time) (reason string, waiting bool)
	writer *foreignWriter
	report *reporter
	kick   chan struct{}
	// apiBack is signalled by the Lease writer when a write succeeds after
	// failing: the API server answers again (see run).
	apiBack chan struct{}

	obsMu     sync.Mutex
	observers []Observer

	// syncMu serializes check: Run and RunOnce may overlap.
	syncMu sync.Mutex
	// conflictSince is when the current streak of conflicting checks
	// began; zero when the last check did not conflict. Guarded by syncMu.
	conflictSince time.Time
	// undeclared logs, once, this process's caBundle targets that the
	// full list of declarations in the Secret had no room for: while it
	// lasts, a successor does not wait for them when this process is down.
	undeclared errlog.Once

	mu       sync.RWMutex
	cas      caSet // the state in force, as last read or written
	leaf     *pki.Issued
	leafPair *pki.KeyPair // leaf, ready to serve
	// alts are the leaves of cfg.keyTypes[1:], in that order, issued and
	// replaced together with leaf; empty with a single key type.
	alts   []*pki.Issued
	leafCA []byte // raw certificate of the CA that signed leaf and alts
	bundle []byte
	pool   *x509.CertPool
	// bundleOf are the CAs bundle and pool were made of: adopt runs at
	// every check and encodes them again only when they change.
	bundleOf []*x509.Certificate
	// leafPEM is leaf's certificate in PEM and leafSerial its serial, for
	// the announcement made at every check; leafPEMOf the certificate they
	// are of.
	leafPEM, leafSerial string
	leafPEMOf           *x509.Certificate
	unsafe              int
	// skew, when set, is why this replica's clock is the suspect (see
	// Authority.clockSkew): it writes nothing and issues no leaf.
	skew     string
	status   RotationStatus
	hasState bool

	// leafIssued is when leaf was issued, on cfg.clock: MinReissueInterval
	// runs from it.
	leafIssued time.Time
	// leafCatchUpUntil: the leaf's CA reached this process's bundle
	// late (it was paused or cut off while the other replicas published
	// or promoted it), so its pod's consumers may lack it until then
	// (RotationStatus.CatchingUp). Zero when they had it.
	leafCatchUpUntil time.Time
}

// issuerConfig is the completed configuration an issuer runs on.
type issuerConfig struct {
	name, commonName string
	// keyTypes are the leaves' key types, the primary (leaf) first.
	keyTypes      []dynamiccert.KeyType
	dnsNames      []string
	ips           []net.IP
	hosts         []string
	lifetime      time.Duration
	checkInterval time.Duration
	clock         clock.WithTicker
	recorder      events.EventRecorder
	eventObject   runtime.Object
}

// caStore keeps an issuer's CA state.
type caStore interface {
	// update reads the current state, passes it to step (machine.step, at
	// now), writes what step decided when it says so, and returns step's
	// result, whose state is the state now in force. A write conflict is
	// resolved inside by re-reading and deciding again. A clock skew is
	// returned as a *clockSkewError with the result (the state as read).
	update(ctx context.Context, now time.Time, step func(stepInput) (stepResult, error)) (stepResult, error)
	// run follows the store until ctx is done, calling kick when it changed
	// underneath; stores that cannot change underneath return at once.
	run(ctx context.Context, kick func())
}

func newIssuer(cfg issuerConfig, sched rotation, store caStore, observers []Observer) *issuer {
	i := &issuer{cfg: cfg, sched: sched, store: store, report: newReporter(cfg.name, cfg.recorder, cfg.eventObject), kick: make(chan struct{}, 1), apiBack: make(chan struct{}, 1)}
	for _, h := range cfg.hosts {
		if ip := net.ParseIP(h); ip != nil {
			i.cfg.ips = append(i.cfg.ips, ip)
		} else {
			i.cfg.dnsNames = append(i.cfg.dnsNames, h)
		}
	}
	for _, o := range observers {
		i.addObserver(o)
	}
	return i
}

// addObserver adds o to the observers a successor CA waits for, and
// re-checks whenever o notifies.
func (i *issuer) addObserver(o Observer) {
	if o == nil {
		return
	}
	i.obsMu.Lock()
	i.observers = append(i.observers, o)
	i.obsMu.Unlock()
	if n, ok := o.(dynamiccertificates.Notifier); ok {
		n.AddListener(observerListener{i})
	}
	i.Enqueue()
}

// observerListener re-checks on an observer's notification only while a
// successor waits: an observer's word matters to nothing else, and a
// chatty one (a contested caBundle target) would otherwise cost a check,
// for an Authority a Secret GET, per notification. The periodic check
// still refreshes what this replica announces.
type observerListener struct{ i *issuer }

func (l observerListener) Enqueue() {
	l.i.mu.RLock()
	waiting := l.i.cas.next != nil
	l.i.mu.RUnlock()
	if waiting {
		l.i.Enqueue()
	}
}

// Enqueue implements dynamiccertificates.Listener: it asks the Run loop to
// check soon. Requests coalesce and never block.
func (i *issuer) Enqueue() {
	select {
	case i.kick <- struct{}{}:
	default:
	}
}

// pending returns the names of the observers that have not confirmed ca:
// local observers by name, replicas as "replica/<id>".
func (i *issuer) pending(ca *x509.Certificate) []string {
	i.obsMu.Lock()
	observers := slices.Clone(i.observers)
	i.obsMu.Unlock()
	var out []string
	for _, o := range observers {
		if !o.Observed(ca) {
			out = append(out, o.Name())
		}
	}
	if i.replicas != nil {
		out = append(out, i.replicas.pending(ca)...)
	}
	return out
}

func (i *issuer) observed(ca *x509.Certificate) bool { return len(i.pending(ca)) == 0 }

// targets returns the caBundle targets this process's observers stand for
// (TargetObserver), sorted.
func (i *issuer) targets() []string {
	i.obsMu.Lock()
	defer i.obsMu.Unlock()
	var out []string
	for _, o := range i.observers {
		if t, ok := o.(TargetObserver); ok {
			for _, name := range t.Targets() {
				if name = cleanTarget(name); name != "" {
					out = append(out, name)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// covering returns the caBundle targets for which a live replica's
// announcement, or this process's own observers, confirm ca: this
// process's own count as soon as its observers hold ca, before its Lease
// says so.
func (i *issuer) covering(ca *x509.Certificate) []string {
	out := i.replicas.covering(ca)
	if own := i.targets(); len(own) > 0 && i.locallyObserved(ca) {
		out = append(out, own...)
		slices.Sort(out)
		out = slices.Compact(out)
	}
	return out
}

// locallyObserved reports whether every local observer holds ca; replicas
// announce only the CAs their own observers confirmed.
func (i *issuer) locallyObserved(ca *x509.Certificate) bool {
	i.obsMu.Lock()
	defer i.obsMu.Unlock()
	for _, o := range i.observers {
		if !o.Observed(ca) {
			return false
		}
	}
	return true
}

// run checks on schedule until ctx is done. A failed check is retried with
// backoff on the configured clock; while it backs off, notifications wait
// for the backoff to end, so a chatty watch cannot make a hot loop.
func (i *issuer) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { i.store.run(ctx, i.Enqueue) })
	if i.replicas != nil {
		wg.Go(func() { i.replicas.run(ctx, i.Enqueue, func() { signal(i.apiBack) }) })
	}
	retry := newIssuerRetry()
	failing := false
	for {
		// The check below covers every notification so far.
		select {
		case <-i.kick:
		default:
		}
		next, err := i.check(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil && failing && i.replicas != nil {
			// The API answers again: the Lease writer need not sit out its
			// backoff to announce what this check adopted.
			signal(i.replicas.apiBack)
		}
		failing = err != nil
		wait, backingOff := retry.after(next, err, i.cfg.checkInterval, i.successorWaits())
		kick, apiBack := i.kick, (<-chan struct{})(nil)
		if backingOff {
			kick = nil
			if i.replicas != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
				apiBack = i.apiBack
			}
			if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
				klog.FromContext(ctx).V(2).Info("CA state keeps changing underneath us; backing off", "provider", i.cfg.name, "retryIn", wait)
			}
		}
		t := i.cfg.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-kick:
			t.Stop()
		case <-apiBack:
			// The Lease writer's request succeeded after failing: the
			// outage is over, retry now rather than at the end of a backoff
			// grown through it. It signals once per failure streak of its
			// own, so this never loops hot.
			t.Stop()
		case <-t.C():
		}
	}
}

// successorWaits reports whether a successor CA waits to sign.
func (i *issuer) successorWaits() bool {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.cas.next != nil
}

// signal sends on a notification channel of capacity one without blocking;
// notifications coalesce.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// check moves the CA state along the schedule at the clock's current time,
// adopts it (bundle, leaf), and returns the time until the next deadline.
func (i *issuer) check(ctx context.Context) (time.Duration, error) {
	i.syncMu.Lock()
	defer i.syncMu.Unlock()
	if i.replicas != nil {
		i.replicas.listOnce(ctx) // know the peers before judging the clock
	}
	now := i.cfg.clock.Now()
	var skew *clockSkewError
	var held *foreignWriterHold
	m := i.machine()
	res, err := i.store.update(ctx, now, func(in stepInput) (stepResult, error) {
		in.obs = observation{all: i.observed, local: i.locallyObserved}
		in.serving = i.currentLeafCA()
		if i.replicas != nil {
			in.consumersMayLack = i.replicas.consumersMayLack
			in.obs.blind, in.obs.lacking = i.replicas.blind, i.replicas.lacking
			in.declares, in.obs.covered = i.targets(), i.covering
			in.peerServes = i.replicas.announces
		}
		return m.step(in)
	})
	st := res.state
	conflict := apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
	if !conflict {
		i.conflictSince = time.Time{}
	}
	switch {
	case err == errWaitingForStore:
		return i.cfg.checkInterval, nil
	case err != nil && ctx.Err() != nil:
		return 0, ctx.Err()
	case conflict:
		i.keepServing(now)
		// A conflict is another replica that wrote first: retried with
		// backoff, not a load error. A streak that outlasts a check
		// interval is one: this replica cannot get anything it decides
		// written (a writer that keeps rewriting the Secret, a server
		// that refuses every write), and must not sit silent in its last
		// state.
		if i.conflictSince.IsZero() {
			i.conflictSince = now
		}
		if now.Sub(i.conflictSince) < i.cfg.checkInterval {
			return 0, err
		}
		return 0, i.report.failedCheck(fmt.Errorf("%s: every read-and-write of the CA secret since %s conflicted: %w",
			i.cfg.name, i.conflictSince.UTC().Format(time.RFC3339), err))
	case errors.As(err, &held):
		// Another writer keeps rewriting the Secret: what this replica
		// has stays in force (renewed from the CA in memory when due), its
		// bundle with the other writer's current CA (foreignWriter), and
		// the hold is reported in Status (ForeignWriter), not as a failed
		// check. Looked at again when the Secret changes, and once it has
		// been left alone long enough to adopt.
		i.mu.RLock()
		ok := i.hasState && i.skew == ""
		i.mu.RUnlock()
		if ok && held.serve.signing != nil && i.sched.valid(held.serve.signing.Cert, now) {
			if err := i.adopt(held.serve, now, true); err != nil {
				klog.Background().Error(err, "Renewing the serving certificate from the CA in memory failed", "provider", i.cfg.name)
			}
		}
		i.report.succeeded()
		return min(held.retryIn, i.cfg.checkInterval), nil
	case errors.As(err, &skew):
		i.holdForSkew(st, now, skew.reason, skew.waiting)
		// Not a failure: looked at again every check interval, and at
		// once when the Secret or a Lease changes.
		i.report.succeeded()
		return i.cfg.checkInterval, nil
	case err != nil:
		err = i.report.failedCheck(fmt.Errorf("%s: %w", i.cfg.name, err))
		i.keepServing(now)
		return 0, err
	}
	i.clockAgrees()
	if len(res.undeclared) > 0 {
		i.undeclared.Error(klog.Background(), fmt.Errorf("%s: caBundle targets %s not declared in the CA secret: it holds %d declarations already, the most it keeps (%s)",
			i.cfg.name, strings.Join(res.undeclared, ", "), maxDeclaredTargets, CABundleTargetsAnnotation),
			"While this replica is down, a successor CA does not wait for these targets; the declarations of removed publishers lapse", "provider", i.cfg.name)
	} else {
		i.undeclared.Recovered(klog.Background(), "Every caBundle target of this replica is declared in the CA secret", "provider", i.cfg.name)
	}
	if res.unsafe {
		i.recordUnsafe(st, res.unsafeWhy)
	}
	if err := i.adopt(st, now, true); err != nil {
		// What the step decided is in force (written, and adopted but for
		// the leaf): its Events and metrics are reported now, since the
		// next step's notes start afresh (an emergency's "signing" Event
		// was lost while the CA key store could not sign its first leaf).
		i.emerg.flush(st, i.currentLeafCA(), i.replicas)
		return 0, i.report.failed(fmt.Errorf("%s: %w", i.cfg.name, err))
	}
	if i.emerg.flush(st, i.currentLeafCA(), i.replicas) {
		i.Enqueue()
	}
	i.report.succeeded()
	return i.nextDeadline().Sub(now), nil
}

// adopt takes st as the state in force: the bundle, a leaf re-signed when
// the schedule says so and issue allows it, the replica announcement and
// the status.
//
// A leaf that cannot be signed (a CA key store that fails or hangs) does
// not stop the rest: the bundle, the announcement and the status still
// follow st, so that peers and consumers see what this replica trusts and
// Status what it decided (the simulator found a promotion, counted unsafe,
// that Status did not show and a Lease that kept announcing the old
// trust); the error is returned, and the leaf is tried again with backoff.
func (i *issuer) adopt(st *caSet, now time.Time, issue bool) error {
	var leafErr error
	i.mu.Lock()
	// The same CAs make the same bundle: then it is unchanged, and the
	// one in force stays, as when it is encoded again to the same bytes.
	bundle, pool := i.bundle, i.pool
	if bundle == nil || !slices.EqualFunc(st.bundle, i.bundleOf, func(a, b *x509.Certificate) bool { return a == b || bytes.Equal(a.Raw, b.Raw) }) {
		bundle, pool = st.bundlePEM()
		i.bundleOf = slices.Clone(st.bundle)
	}
	changed := !bytes.Equal(bundle, i.bundle)
	if changed {
		i.bundle, i.pool = bundle, pool
	}
	if i.cas.signing == nil || !bytes.Equal(i.cas.signing.Cert.Raw, st.signing.Cert.Raw) {
		// Listeners are told when the signing CA changes (podcert's Signer
		// signs with it), also while MinReissueInterval holds this
		// process's new leaf back.
		changed = true
	}
	i.cas, i.hasState = st.clone(), true
	if st.signing.Key == nil {
		// The CA in force was adopted without its key (knative): serve the
		// other tool's leaf until the successor is observed and signs.
		if st.legacy != nil && (i.leaf == nil || !i.leaf.Cert.Equal(st.legacy.Cert)) {
			i.leaf, i.alts, i.leafPair, i.leafCA, changed = st.legacy, nil, st.legacy.KeyPair(), st.signing.Cert.Raw, true
			i.report.Loaded(st.legacy.Cert, "adopted", true, "caSerial", serial(st.signing.Cert))
		}
	} else if _, held := i.reissueFloor(now); issue && !held && i.sched.leafDue(i.leaf, i.leafCA, st, now) && (mutations.compromisedSigns || !i.emerg.compromised(st.ops, st.signing.Cert)) {
		// A CA marked compromised signs no new leaf, not even for a
		// replica that has none yet (started mid-emergency): it serves
		// nothing, or the leaf it has, until the successor signs, which
		// happens as soon as every observer and live replica has it. A
		// leaf it signed now would keep it in ca.crt for as long.
		// Every key type is issued before any is swapped in, so the leaves
		// always come from the same CA and renew together.
		issued := make([]*pki.Issued, len(i.cfg.keyTypes))
		for n, kt := range i.cfg.keyTypes {
			if issued[n], leafErr = i.sched.issueLeaf(st, pki.KeyType(kt), i.cfg.commonName, i.cfg.dnsNames, i.cfg.ips, i.cfg.lifetime, now); leafErr != nil {
				break
			}
		}
		if leafErr == nil {
			i.leaf, i.alts, i.leafPair, i.leafCA, changed = issued[0], issued[1:], issued[0].KeyPair(), st.signing.Cert.Raw, true
			i.leafIssued = now
			i.leafCatchUpUntil = time.Time{}
			if !st.signingSince.IsZero() {
				i.leafCatchUpUntil = st.signingSince.Add(i.sched.propagation)
			}
			// The alternatives are reported by the sni controller, which
			// parses them: whoever parses a certificate reports it
			// (internal/certreport).
			i.report.Loaded(issued[0].Cert, "keyType", i.cfg.keyTypes[0], "caSerial", serial(st.signing.Cert))
		}
	}
	var leafSerial, leafPEM string
	var leafKey crypto.Signer
	if i.leaf != nil { // none yet while the clock is skewed
		if i.leafPEMOf != i.leaf.Cert {
			i.leafPEM, i.leafSerial, i.leafPEMOf = string(leafCertPEM(i.leaf.Cert)), serial(i.leaf.Cert), i.leaf.Cert
		}
		leafSerial, leafPEM, leafKey = i.leafSerial, i.leafPEM, i.leaf.Key
	}
	i.mu.Unlock()

	if i.replicas != nil {
		m := i.machine()
		trusted := m.announced(st, now, i.locallyObserved)
		i.replicas.announce(trusted, bundle, leafSerial, leafPEM, leafKey, i.targets())
	}
	i.updateStatus(st, now)
	if changed {
		i.notify()
	}
	return leafErr
}

// keepServing renews this process's leaf from the state last in force when
// the store cannot be read or written (an API outage, RBAC, content it
// cannot parse): the signing CA and its key are still here and still
// trusted, so the serving certificate does not expire with the outage. The
// schedule does not move: that needs the store.
func (i *issuer) keepServing(now time.Time) {
	i.mu.RLock()
	st, ok := i.cas.clone(), i.hasState && i.skew == ""
	i.mu.RUnlock()
	if !ok || !i.sched.valid(st.signing.Cert, now) {
		return // nothing to sign with, or a clock that is the suspect
	}
	if err := i.adopt(&st, now, true); err != nil {
		klog.Background().Error(err, "Renewing the serving certificate from the CA in memory failed", "provider", i.cfg.name)
	}
}

// recordUnsafe reports a rotation in which a CA signed before it was
// observed: clients that did not refresh their trust will fail until they do.
func (i *issuer) recordUnsafe(st *caSet, why string) {
	i.mu.Lock()
	i.unsafe++
	i.mu.Unlock()
	certmetrics.UnsafeRotation(i.cfg.name)
	msg := why + "; clients must refresh their trust bundle"
	klog.Background().Error(nil, "Unsafe CA rotation", "provider", i.cfg.name, "detail", msg, "caSerial", serial(st.signing.Cert))
	i.report.Event(corev1.EventTypeWarning, dynamiccert.ReasonUnsafeCARotation, certreport.ActionRotate, msg)
}

func (i *issuer) nextDeadline() time.Time {
	i.mu.RLock()
	defer i.mu.RUnlock()
	now := i.cfg.clock.Now()
	if i.cas.signing.Key == nil || i.leaf == nil {
		// An adopted CA without its key, serving the other tool's leaf
		// (which may be due already): only the successor's minimum delay
		// and the observers move things on; look again at least every
		// check interval.
		next := now.Add(i.cfg.checkInterval)
		if i.cas.next != nil {
			if signs := i.sched.signsNoEarlierThan(&i.cas); signs.After(now) {
				next = earliest(next, signs)
			}
		}
		return next
	}
	next := i.sched.nextDeadline(&i.cas, i.leaf.Cert, now)
	if end, held := i.reissueFloor(now); held && i.sched.leafDue(i.leaf, i.leafCA, &i.cas, now) {
		// The leaf is due but the floor holds it back: its due time is
		// past, and a deadline in the past would be a busy loop. Wake when
		// the floor ends, or earlier for anything else still ahead.
		if next.After(now) {
			next = earliest(next, end)
		} else {
			next = end
		}
	}
	if i.cas.next != nil {
		// Replicas and observers notify; still look again at least every
		// check interval while a successor waits.
		next = earliest(next, now.Add(i.cfg.checkInterval))
	}
	if i.leafCatchUpUntil.After(now) {
		// Ready again then (RotationStatus.CatchingUp): the status is
		// computed at a check.
		next = earliest(next, i.leafCatchUpUntil)
	}
	if !next.After(now) {
		// The check just made did all it could at now (a due leaf that a
		// CA marked compromised may not sign, see adopt): a deadline that
		// is not ahead would be a busy loop, which the simulator found.
		// Notifications still wake the loop sooner.
		next = now.Add(i.cfg.checkInterval)
	}
	return next
}

// currentParsedCertKey returns the leaf PEM and the leaf ready to serve, or
// nil, nil, nil before the first one.
func (i *issuer) currentParsedCertKey() ([]byte, []byte, *tls.Certificate) {
	i.mu.RLock()
	defer i.mu.RUnlock()
	if i.leaf == nil {
		return nil, nil, nil
	}
	return i.leaf.CertPEM, i.leaf.KeyPEM, &i.leafPair.TLS
}

// currentCertKey returns the leaf PEM, or nil, nil before the first one.
func (i *issuer) currentCertKey() ([]byte, []byte) {
	i.mu.RLock()
	defer i.mu.RUnlock()
	if i.leaf == nil {
		return nil, nil
	}
	return i.leaf.CertPEM, i.leaf.KeyPEM
}

func (i *issuer) currentBundle() []byte {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.bundle
}

func (i *issuer) verifyOptions() (x509.VerifyOptions, bool) {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return clientVerifyOptions(i.pool), i.bundle != nil
}

func (i *issuer) currentLeaf() *x509.Certificate {
	i.mu.RLock()
	defer i.mu.RUnlock()
	if i.leaf == nil {
		return nil
	}
	return i.leaf.Cert
}

func (i *issuer) renewAt() time.Time {
	i.mu.RLock()
	defer i.mu.RUnlock()
	if i.leaf == nil {
		return time.Time{}
	}
	at := i.leaf.Cert.NotAfter.Add(-i.sched.leafRenewBefore)
	if end := i.leafIssued.Add(MinReissueInterval); end.After(at) {
		at = end
	}
	return at
}

// reissueFloor returns when MinReissueInterval after the last issuance
// ends, and whether it holds at now, so that no leaf may be issued yet. It
// never holds before the first leaf, nor when the clock is behind the last
// issuance (it went back; the leaf may not be valid any more): a floor
// measured from the future would hold for as long as the clock is behind.
// The caller holds mu.
func (i *issuer) reissueFloor(now time.Time) (time.Time, bool) {
	end := i.leafIssued.Add(MinReissueInterval)
	return end, i.leaf != nil && !now.Before(i.leafIssued) && now.Before(end)
}

// machine is the rotation's state machine with this issuer's rules.
func (i *issuer) machine() machine {
	return machine{sched: i.sched, emerg: i.emerg, repair: i.repair, judge: i.judge, writer: i.writer}
}

// memoryStore keeps the CA state in memory (SelfSigned): nobody else writes
// it, so it is never lost (no last) and never contested.
type memoryStore struct{ cs caSet }

func (m *memoryStore) update(_ context.Context, now time.Time, step func(stepInput) (stepResult, error)) (stepResult, error) {
	work := m.cs.clone()
	in := stepInput{now: now, read: &work, exists: work.signing != nil}
	if work.signing != nil {
		// The state is never lost here, but step keeps this process's
		// memory (when it first saw the successor) from last.
		last := m.cs.clone()
		in.last = &last
	}
	res, err := step(in)
	if err != nil {
		return stepResult{}, err
	}
	m.cs = *res.state
	res.state = &m.cs
	return res, nil
}

func (m *memoryStore) run(context.Context, func()) {}

// issuerRetry decides how long the Run loop sleeps after a check: until the
// next deadline, at most the check interval, after a success; the next
// backoff delay after a failure. It is owned by one loop.
type issuerRetry struct {
	backoff *backoff.Backoff
	// waiting backs off while a successor waits to sign: capped at
	// successorRetryCap, so that promotion follows the end of an outage
	// within seconds.
	waiting *backoff.Backoff
}

// successorRetryCap caps the backoff of the issuer's checks while a
// successor CA waits to sign (backoff.DefaultCap otherwise): with jitter, a
// failed check (its first request is a GET of the Secret) is retried within
// 6 s, and the first that succeeds wakes the Lease writer (replicaSet.run),
// so the successor signs within 10 s of the API server answering again
// (issue 22). It costs one GET every 4-6 s per replica during an outage,
// and only during a rotation.
const successorRetryCap = 4 * time.Second

func newIssuerRetry() *issuerRetry {
	return &issuerRetry{
		backoff: backoff.New(backoff.DefaultInitial, backoff.DefaultCap),
		waiting: backoff.New(backoff.DefaultInitial, successorRetryCap),
	}
}

// after returns the wait after a check that ended with err and, on success,
// next until its next deadline. backingOff reports a failure: the wait is a
// backoff delay, which neither the check interval nor an event may shorten.
// successorWaits selects the shorter backoff (successorRetryCap).
func (r *issuerRetry) after(next time.Duration, err error, checkInterval time.Duration, successorWaits bool) (wait time.Duration, backingOff bool) {
	if err != nil {
		if successorWaits {
			return r.waiting.Next(err), true
		}
		return r.backoff.Next(err), true
	}
	r.backoff.Reset()
	r.waiting.Reset()
	return min(max(next, 0), checkInterval), false
}
