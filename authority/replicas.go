package authority

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/errlog"
)

// Labels and annotations of the Lease each Authority replica announces
// itself with.
const (
	// LeaseLabel selects the Leases of the replicas of one
	// Authority; its value is LeaseLabelValue of the CA Secret's
	// name: the name itself, unless it is longer than a label value may be.
	LeaseLabel = "evercert.io/authority"
	// TrustedCAsAnnotation lists the Fingerprints of the CAs the
	// replica has loaded and its own observers have confirmed, comma
	// separated; a successor only once its minimum delay has passed since
	// this replica first saw it. A successor its observers confirmed
	// whose delay still runs is listed as DelayedCAPrefix and its
	// Fingerprint: peers (and releases before the prefix) do not count it
	// as trusted, and a promotion forced by the signing CA's end knows
	// that this replica's consumers hold it.
	TrustedCAsAnnotation = "evercert.io/trusted-cas"
	// DelayedCAPrefix marks an entry of TrustedCAsAnnotation that is
	// confirmed by the replica's observers but waits for its delay.
	DelayedCAPrefix = "~"
	// BundleHashAnnotation is the SHA-256 (hex) of the ca.crt
	// bundle the replica has loaded.
	BundleHashAnnotation = "evercert.io/bundle-sha256"
	// LeafSerialAnnotation is the serial (hex) of the leaf the
	// replica serves.
	LeafSerialAnnotation = "evercert.io/leaf-serial"
	// LeafAnnotation is the PEM of the leaf certificate the
	// replica serves (the certificate only, never its key), so that what
	// is published can be checked against every live replica's leaf
	// (Authority.ServedChains).
	LeafAnnotation = "evercert.io/leaf"
	// ClocksAheadAnnotation lists, comma separated, the replica
	// IDs of the live replicas whose Lease renewals show their clocks ahead
	// of this replica's by more than the skew tolerance. It is how a
	// replica whose clock leads learns it: its own view of the others'
	// renewals only bounds their clocks from below (see clockSkew).
	ClocksAheadAnnotation = "evercert.io/clocks-ahead"
)

// announcement is what one replica says about itself.
type announcement struct {
	trusted    string // sorted fingerprints, comma separated
	bundleHash string
	leafSerial string
	leafPEM    string
	// clocksAhead: the replica IDs whose clocks are ahead of ours beyond
	// the tolerance, sorted, comma separated.
	clocksAhead string
	// covered: the caBundle targets this replica's observers stand for
	// (CoveredTargetsAnnotation), sorted, one per line.
	covered string
}

// seenLease is another (or this) replica's announcement as last believed
// (see SignatureAnnotation: only signed announcements whose leaf
// chains to a CA in the Secret, and that are not older than the last one
// believed for the Lease, are), and
// when this process saw it change, on its own clock: liveness is judged by
// when a renewal was observed, never by the writer's timestamps, so clocks
// that disagree cannot make a live replica look dead or the reverse.
type seenLease struct {
	holder  string
	trusted []string
	rv      string // resourceVersion and renewTime last seen
	version string // resourceVersion last seen
	// deleted: the Lease is gone. That is no evidence the replica is (it
	// recreates its Lease at its next renewal), so it is waited for until
	// its last renewal ages out, then forgotten.
	deleted bool
	// leaf is the leaf the replica announced it serves; nil when it
	// announced none (an older version) or one that does not parse.
	leaf       *x509.Certificate
	observedAt time.Time
	duration   time.Duration
	// delta is the renewTime the replica wrote, on its clock, minus when
	// this process saw the renewal, on its own (hasDelta: it wrote one).
	// The renewal happened before it was seen, so delta is a lower bound
	// of how far the replica's clock is ahead of ours: by as much as the
	// renewal waited to be seen, at most a renewal interval (a third of
	// duration) while the replica is live, it is too low.
	delta    time.Duration
	hasDelta bool
	// stale: this process stopped watching for longer than the skew
	// tolerance since it saw the renewal (it was paused, or its clock
	// jumped): delta no longer compares the clocks as they are now, until
	// the next renewal is seen.
	stale bool
	// firstSeen: this is the first version of the Lease this process saw
	// (a list at start, or a replica that just started), not a renewal it
	// watched happen. Its renewTime may be old by any amount (a replica
	// that died a moment ago), so delta still bounds the writer's clock
	// from below but says nothing of it being behind ours.
	firstSeen bool
	// writtenAt is when the API server applied this version (see
	// serverWriteTime); zero when the Lease does not say.
	writtenAt time.Time
	// firstSeenAt is when this process saw the Lease first, for a
	// firstSeen version.
	firstSeenAt time.Time
	// renewTime is the renewTime the replica wrote, on its own clock.
	renewTime time.Time
	// clocksAhead are the replica IDs its announcement says are ahead of
	// its own clock (ClocksAheadAnnotation).
	clocksAhead []string
	// bundleHash is the SHA-256 (hex) of the ca.crt bundle the replica
	// announced it loaded (BundleHashAnnotation).
	bundleHash string
	// covered are the caBundle targets its observers stand for
	// (CoveredTargetsAnnotation): trusted holds CAs each of them holds.
	covered []string
}

// replicaSet announces this replica in a Lease and watches the Leases of
// the others, so a successor CA can wait until every live replica has
// loaded it. Announcement errors (RBAC, API down) are logged once per
// distinct error and retried with backoff; they never block rotation on
// their own: a replica whose Lease cannot be seen is not waited for.
type replicaSet struct {
	client    kubernetes.Interface
	namespace string
	authority string // the CA Secret's name
	provider  string // the Authority's name, for metrics
	id        string
	leaseName string
	duration  time.Duration
	// skew is the clock skew tolerated between replicas.
	skew  time.Duration
	clock clock.WithTicker
	// report reports the writes of this replica's Lease; watchReport the
	// watch of the others', under the same provider name. They fail and
	// recover apart (RBAC may allow one and not the other), and a write that
	// succeeds must not make a watch failure retried since look new. The
	// informer does not say when its watch recovers (a list that succeeds
	// may be followed by a watch that fails again), so watchReport counts a
	// failure again only when its message changes.
	report      *reporter
	watchReport *reporter
	wantChange  chan struct{}
	// apiBack is signalled by the issuer when a check succeeds after
	// failing: the API server answers again (see run).
	apiBack chan struct{}
	// writeFailing: the last write of this replica's Lease failed; the
	// issuer then reads the Secret with a GET rather than from its watch
	// (secretReads), so its checks find out when the API server answers
	// again.
	writeFailing atomic.Bool

	mu   sync.Mutex
	want announcement
	// wantKey is the private key of the leaf in want, which signs the
	// announcement; nil when there is no leaf (nothing is signed then, and
	// the other replicas do not believe the announcement).
	wantKey crypto.Signer
	// hashedBundle is the last bundle announce hashed, and bundleHash its
	// hash (announcement.bundleHash).
	hashedBundle []byte
	bundleHash   string
	written      announcement
	wroteAt      time.Time
	// renewedAt is the renewTime last written, at the microsecond
	// precision the API server stores: the next one is later, so every
	// write is newer than the last to the replicas that judge replays.
	renewedAt time.Time
	// own is this replica's Lease as its last write returned it, or as the
	// watch showed it before this process wrote it; nil when unknown. A
	// renewal is one Update of it, carrying its resourceVersion: no GET
	// (issue 22). Never modified: writes work on a copy.
	own *coordinationv1.Lease
	// ownKey is the key that signed own (nil when this process did not
	// write it): release signs the Lease's last version with it.
	ownKey crypto.Signer
	seen   map[string]*seenLease // by Lease name
	// newestWrite is the latest time, on the API server's clock, at which
	// a Lease this process believed was written (see serverWriteTime): a
	// lower bound of the server's clock when the Leases were read, taken
	// from the same stream as the Leases it is compared with (see
	// expireDeadOnServerLocked).
	newestWrite time.Time
	// awakeUntil is when the run loop, which wakes at least every third of
	// the lease duration, is due to wake next; while it works, when it last
	// woke. Time past it was not spent watching (a paused process, a clock
	// that jumped): it does not count towards a Lease's expiry.
	awakeUntil time.Time
	// collectForbidden stops collect after RBAC forbade a delete.
	collectForbidden bool
	// forbidden says which request on this replica's own Lease RBAC
	// forbade last (see leaseFailed); "" once a write succeeds. The other
	// replicas cannot wait for a replica whose announcements they never
	// see, so it is reported in Status and fails readiness.
	forbidden string
	// listed: the peers' Leases were listed once (see listOnce), or
	// listing them is forbidden and will stay so.
	listed bool
	// listForbidden: the list was forbidden, so this process never learnt
	// whether its pod ran before (see consumersMayLack).
	listForbidden bool
	// listFailedSince: when the first list of this process failed for
	// another reason (a timeout, a 5xx, a 429, the API not served); zero
	// once one succeeded. See unlistedLocked.
	listFailedSince time.Time
	// leafWatched: a change of a replica's announced leaf kicks the issuer
	// too, while an emergency rotation waits for every replica to serve a
	// successor leaf (emergency.flush); otherwise it matters to nothing.
	leafWatched bool

	// What announcements are believed (announce_sign.go). roots are the
	// CAs of the Secret as last read (rootsKnown: read at least once; an
	// announcement seen before waits in held); rootsGen counts their
	// changes. marks is the last announcement believed per Lease,
	// judgedVersion the version (see observe) last judged per Lease, so a
	// relist does not count a rejection again; rejectLog logs each
	// rejection once per Lease and reason.
	// names is leafNames of this Authority's leaves: an announced leaf for
	// other names is not believed (set by New; "" checks none).
	names string
	// otherNames are the leaf names the Secret lists for its replicas
	// (ReplicaNamesAnnotation), as last read with roots.
	otherNames    []string
	roots         []*x509.Certificate
	rootsKnown    bool
	rootsGen      uint64
	marks         map[string]announcementMark
	held          map[string]heldLease
	judgedVersion map[string]string
	rejectLog     errlog.ByKey
}

func newReplicaSet(client kubernetes.Interface, namespace, authority, id, providerName string, duration, skew time.Duration, clk clock.WithTicker) *replicaSet {
	name := replicaLeaseName(authority, id)
	reportName := providerName + "/replica-announcement"
	return &replicaSet{
		client: client, namespace: namespace, authority: authority, provider: providerName, id: id, leaseName: name,
		duration: duration, skew: skew, clock: clk, report: newReporter(reportName, nil, nil), watchReport: newReporter(reportName, nil, nil),
		wantChange: make(chan struct{}, 1), apiBack: make(chan struct{}, 1), seen: map[string]*seenLease{},
		marks: map[string]announcementMark{}, held: map[string]heldLease{}, judgedVersion: map[string]string{},
	}
}

// announce sets what this replica announces; the run loop writes it,
// signed with leafKey, the private key of the leaf leafPEM (nil without a
// leaf). covered are the caBundle targets its observers stand for.
func (r *replicaSet) announce(trusted []string, bundle []byte, leafSerial, leafPEM string, leafKey crypto.Signer, covered []string) {
	slices.Sort(trusted)
	covered = slices.Clone(covered)
	for n := range covered {
		covered[n] = cleanTarget(covered[n])
	}
	slices.Sort(covered)
	covered = slices.Compact(covered)
	a := announcement{trusted: strings.Join(trusted, ","), leafSerial: leafSerial, leafPEM: leafPEM,
		covered: strings.Trim(strings.Join(covered, "\n"), "\n")}
	now := r.clock.Now()
	r.mu.Lock()
	// The bundle changes at a rotation step, and is announced at every
	// check: comparing it costs less than hashing it again.
	if !bytes.Equal(bundle, r.hashedBundle) || r.hashedBundle == nil {
		sum := sha256.Sum256(bundle)
		r.hashedBundle, r.bundleHash = bytes.Clone(bundle), hex.EncodeToString(sum[:])
	}
	a.bundleHash = r.bundleHash
	a.clocksAhead = strings.Join(r.clocksLocked(now).ahead, ",")
	changed := a != r.want
	r.want, r.wantKey = a, leafKey
	r.mu.Unlock()
	if changed {
		select {
		case r.wantChange <- struct{}{}:
		default:
		}
	}
}

// pending returns "replica/<id>" for every live replica whose announcement
// does not hold ca.
func (r *replicaSet) pending(ca *x509.Certificate) []string {
	return r.pendingOf(ca, false)
}

// lacking reports whether a live replica whose announcement is current
// (renewed since this process last stopped watching) does not hold ca:
// its observers have not confirmed it, so its consumers lack ca for sure.
// One whose observers confirmed ca while its delay runs (DelayedCAPrefix)
// holds it. (Before the prefix, a peer publishing the same bundle was
// taken to hold it, so a forced promotion under a replica whose own
// observer lagged was counted safe: a review found it.)
func (r *replicaSet) lacking(ca *x509.Certificate) bool {
	return len(r.pendingOf(ca, true)) > 0
}

// unlistedPeers stands in pendingOf and servingFrom for the peers this
// process does not know yet: no list of the Leases has succeeded (listOnce
// failed with a timeout, a 5xx, a 429). Until one does, an empty view is
// ignorance, not evidence that nobody lacks a CA or serves a leaf: a new
// process that judged on it would promote a successor, or drain a
// compromised CA, under a live peer that does not hold it (simulator S2).
// It waits instead; listOnce is tried again at every check. A list that
// RBAC forbids is another matter (see blind): it will stay so, and an
// emergency goes on counted unsafe rather than wait for ever.
const unlistedPeers = "replicas (their Leases are not listed yet)"

// unlistedLocked reports whether this process waits for its first list of
// the Leases: none succeeded, and the first failure is less than a lease
// duration old. Past that the wait ends, and the process is blind (see
// blind) as when RBAC forbids the list: an emergency goes on counted unsafe
// rather than leave the compromised CA signing for as long as the API
// server fails lists (a review found it waiting for ever, unseen).
func (r *replicaSet) unlistedLocked(now time.Time) bool {
	return !r.listed && (r.listFailedSince.IsZero() || now.Sub(r.listFailedSince) < r.duration)
}

func (r *replicaSet) pendingOf(ca *x509.Certificate, current bool) []string {
	fp := Fingerprint(ca)
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	unseen := r.unseenLocked(now)
	if current && unseen > r.skew {
		return nil // every announcement is stale until renewed
	}
	var out []string
	if r.unlistedLocked(now) {
		out = append(out, unlistedPeers)
	}
	for _, l := range r.seen {
		if current && slices.Contains(l.trusted, DelayedCAPrefix+fp) {
			continue // its consumers hold ca; only its delay runs
		}
		if r.waitedForLocked(l, now, unseen) && !slices.Contains(l.trusted, fp) && !(current && l.stale) {
			out = append(out, "replica/"+l.holder)
		}
	}
	slices.Sort(out)
	return out
}

// covering returns the caBundle targets that live replicas' believed
// announcements (this replica's own Lease included, once seen) name and
// that trust ca: the evidence that those targets hold ca
// (machine.uncoveredTargets). A stale announcement (this process was
// paused) still counts while its Lease has not aged out, as in pending.
func (r *replicaSet) covering(ca *x509.Certificate) []string {
	fp := Fingerprint(ca)
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	unseen := r.unseenLocked(now)
	var out []string
	for _, l := range r.seen {
		// A successor its observers confirmed while its delay runs
		// (DelayedCAPrefix) is in its targets too: they are observers.
		if len(l.covered) > 0 && now.Before(l.observedAt.Add(l.duration+unseen)) && (slices.Contains(l.trusted, fp) || slices.Contains(l.trusted, DelayedCAPrefix+fp)) {
			out = append(out, l.covered...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// run watches the Leases and writes this replica's until ctx is done. When
// a write succeeds after failing, apiBack tells the issuer the API server
// answers again.
func (r *replicaSet) run(ctx context.Context, kick, apiBack func()) {
	r.woke()
	// Runs last, once the writer and the watch have stopped.
	defer r.release(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.watch(ctx, kick) })

	// Failed writes back off up to backoff.DefaultCap even while a
	// successor waits: the issuer's checks, which retry sooner then (see
	// successorRetryCap), find out when the API server answers again and
	// wake this loop through apiBack.
	retry := backoff.New(backoff.DefaultInitial, backoff.DefaultCap)
	failing := false
	for {
		wait, err := r.writeIfDue(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			_ = r.report.failed(err)
			wait = retry.Next(err)
			if !failing {
				// While Lease writes fail the issuer reads the Secret with
				// GETs, not from its watch (secretReads): kick it so that
				// its checks, which back off less while a successor waits,
				// fail too and find out when the API server answers again
				// (then apiBack wakes this loop). Once per failure streak.
				r.writeFailing.Store(true)
				kick()
			}
		} else {
			r.report.succeeded()
			retry.Reset()
			if failing {
				apiBack()
			}
			r.collect(ctx)
		}
		failing = err != nil
		r.writeFailing.Store(failing)
		t := r.clock.NewTimer(wait)
		r.asleep(wait)
		change, back := r.wantChange, (<-chan struct{})(nil)
		if err != nil {
			change = nil // back off even if the announcement changes
			back = r.apiBack
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-change:
			t.Stop()
		case <-back:
			// The issuer's check succeeded after failing: the outage is
			// over, write now rather than at the end of a backoff grown
			// through it. The issuer signals once per failure streak of
			// its own, so this never loops hot.
			t.Stop()
		case <-t.C():
		}
		r.woke()
	}
}

// waitedForLocked reports whether this process still waits for the replica
// of l at now, in everything that waits for live replicas (a successor's
// observers, a drain, the bundles, leaves and names they serve): until l's
// duration has passed since its renewal was seen, plus unseen (see
// unseenLocked), plus leaseMargin.
func (r *replicaSet) waitedForLocked(l *seenLease, now time.Time, unseen time.Duration) bool {
	return now.Before(l.observedAt.Add(l.duration + unseen + leaseMargin(l.duration, r.skew)))
}

// leaseMargin is how long past its duration a Lease is still waited for:
// twice the skew tolerance, at most a renewal interval (a third of
// duration). The Lease holds on its holder's clock, and this process
// measures the duration on its own: a clock that runs fast, or either
// clock stepping, makes the measure short by as much as the two clocks'
// offset moved meanwhile. Two clocks within the tolerance of each other
// can move from one side of it to the other: twice the tolerance. Without
// the margin a replica counted a peer gone while the peer's Lease still
// held on the peer's clock, and promoted an emergency's successor under it
// (simulator seeds 5033, a clock gaining 0.3 s a minute, and 200906, a
// clock stepped back 13 s; with the tolerance once, a review's 200900:
// clocks 44 s apart; S2). The cap keeps a gone replica from holding a
// rotation for twice the whole tolerance (an hour by default): clocks
// that move further than a renewal interval apart within one lease
// duration are beyond what a Lease can tell.
func leaseMargin(duration, skew time.Duration) time.Duration {
	return min(2*skew, duration/3)
}

// LeaseWaitedFor is the longest a replica counts a peer live after it saw
// the peer renew its Lease, whatever its SkewTolerance: the Lease's
// duration and the largest margin for clocks that drift or step (a third
// of the duration; smaller only with a tolerance under a sixth of it).
// Tools that judge liveness from a Lease's renewTime, as the evercert CLI
// does, count a replica live this long after renewTime: as long as a
// replica that saw the renewal when it was made waits. A replica that saw
// it later (its watch lagged, or it started since and saw the Lease for
// the first time) waits from then, so it can still wait for a replica
// such a tool reports gone: the tool cannot know when each replica saw
// what.
func LeaseWaitedFor(duration time.Duration) time.Duration {
	return duration + leaseMargin(duration, duration)
}

// unseenLocked is how long this process has not been watching as of now,
// because it was paused (or its clock jumped) and the run loop has not
// noticed yet: renewals that happened meanwhile have not been seen. r.mu
// must be held.
func (r *replicaSet) unseenLocked(now time.Time) time.Duration {
	if r.awakeUntil.IsZero() {
		return 0
	}
	return max(0, now.Sub(r.awakeUntil))
}

// woke records that the run loop is awake. If it woke late, this process
// was paused (or its clock jumped) for that long and saw no renewals
// meanwhile: that time does not count towards any Lease's expiry, so a
// replica that kept renewing is not taken for dead before its renewals
// arrive.
func (r *replicaSet) woke() {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.catchUpLocked(now)
	r.awakeUntil = now
}

// asleep records that the run loop sleeps for wait. A pause while it
// worked counts like one while it slept.
func (r *replicaSet) asleep(wait time.Duration) {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.catchUpLocked(now)
	r.awakeUntil = now.Add(wait)
}

// catchUpLocked moves every Lease's observation forward by the time not
// spent watching. r.mu must be held.
func (r *replicaSet) catchUpLocked(now time.Time) {
	if unseen := r.unseenLocked(now); unseen > 0 {
		for _, l := range r.seen {
			l.observedAt = earliest(l.observedAt.Add(unseen), now)
			l.stale = l.stale || unseen > r.skew
		}
	}
}

// leaseGCAfter is how many of its lease durations a replica's Lease goes
// unrenewed, as seen by this process, before this process deletes it.
const leaseGCAfter = 10

// collect forgets deleted Leases once they aged out, and deletes the Leases
// of replicas that are long gone. Every process
// start announces itself under a new replica ID, so without this a
// Deployment would leave one Lease per pod it ever ran. The delete is
// conditional on the resourceVersion last seen, so a replica that renewed
// meanwhile keeps its Lease; RBAC that forbids it is reported once and
// leaves the Leases alone.
func (r *replicaSet) collect(ctx context.Context) {
	now := r.clock.Now()
	type gone struct{ name, version string }
	var dead []gone
	r.mu.Lock()
	unseen := r.unseenLocked(now)
	for name, l := range r.seen {
		switch {
		case l.deleted && !r.waitedForLocked(l, now, unseen):
			delete(r.seen, name) // gone, and no longer waited for
			r.forgetAnnouncementLocked(name)
		case !l.deleted && !r.collectForbidden && name != r.leaseName && !now.Before(l.observedAt.Add(leaseGCAfter*l.duration+unseen)):
			dead = append(dead, gone{name, l.version})
		}
	}
	r.mu.Unlock()
	leases := r.client.CoordinationV1().Leases(r.namespace)
	for _, d := range dead {
		err := leases.Delete(ctx, d.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &d.version}})
		switch {
		case err == nil:
			klog.FromContext(ctx).V(2).Info("Deleted the Lease of a replica that is gone", "provider", r.report.Provider(), "lease", klog.KRef(r.namespace, d.name))
		case apierrors.IsNotFound(err):
			// Gone already, perhaps before the watch ever listed it (this
			// process saw it in its first list): no delete event will
			// come to forget it by, so forget it here.
			r.mu.Lock()
			if l := r.seen[d.name]; l != nil && l.version == d.version {
				delete(r.seen, d.name)
				r.forgetAnnouncementLocked(d.name)
			}
			r.mu.Unlock()
		case apierrors.IsForbidden(err):
			r.mu.Lock()
			r.collectForbidden = true
			r.mu.Unlock()
			klog.FromContext(ctx).Info("Cannot delete the Leases of replicas that are gone (RBAC: allow delete on leases.coordination.k8s.io); they stay until removed",
				"provider", r.report.Provider(), "lease", klog.KRef(r.namespace, d.name))
			return
		}
		// NotFound, Conflict (renewed meanwhile), transient errors: look
		// again at the next renewal.
	}
}

// writeIfDue writes the Lease when the announcement changed or a renewal
// is due (a third of the lease duration after the last write), and returns
// how long until the next renewal.
func (r *replicaSet) writeIfDue(ctx context.Context) (time.Duration, error) {
	now := r.clock.Now()
	renewEvery := r.duration / 3
	r.mu.Lock()
	want, key, written, wroteAt, renewedAt := r.want, r.wantKey, r.written, r.wroteAt, r.renewedAt
	r.mu.Unlock()
	if want == (announcement{}) {
		return renewEvery, nil // nothing loaded yet
	}
	if want == written && now.Before(wroteAt.Add(renewEvery)) {
		return wroteAt.Add(renewEvery).Sub(now), nil
	}
	r.mu.Lock()
	base := r.own
	r.mu.Unlock()
	// The API server keeps renewTime to the microsecond. Two writes within
	// one (an announcement that changed twice at once) still get
	// increasing renewTimes, or the second would look like a replay.
	renew := now.Truncate(time.Microsecond)
	if !renew.After(renewedAt) && renewedAt.Sub(renew) < time.Millisecond {
		renew = renewedAt.Add(time.Microsecond)
	}
	verb := leaseWriteVerb(base)
	lease, err := r.write(ctx, base, want, key, renew)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsAlreadyExists(err) {
		// The Lease changed underneath (another writer, a delete, a write
		// committed although its response was lost, or the watch showed an
		// older version than the one written): read it back. Only here is
		// it read.
		current, getErr := r.client.CoordinationV1().Leases(r.namespace).Get(ctx, r.leaseName, metav1.GetOptions{})
		switch {
		case getErr == nil:
			base = current
		case apierrors.IsNotFound(getErr):
			base = nil
		default:
			r.leaseFailed("get", getErr)
			return 0, fmt.Errorf("reading replica lease %s/%s: %w", r.namespace, r.leaseName, describeLeaseError(getErr))
		}
		r.mu.Lock()
		r.own = base
		r.mu.Unlock()
		if !r.writeFailing.Load() {
			// Write again at once. Not while writes keep failing: then the
			// next attempt, after the backoff, writes on what was read, so
			// an attempt costs two requests as it always did (a GET and a
			// write), never three.
			verb = leaseWriteVerb(base)
			lease, err = r.write(ctx, base, want, key, renew)
		}
	}
	if err != nil {
		r.leaseFailed(verb, err)
		// own stays: after an outage the next renewal is still one Update
		// (a write that was committed although it failed here conflicts,
		// and is read back).
		return 0, fmt.Errorf("writing replica lease %s/%s: %w", r.namespace, r.leaseName, describeLeaseError(err))
	}
	r.mu.Lock()
	r.written, r.wroteAt, r.own, r.renewedAt = want, now, lease, renew
	r.ownKey = key
	r.forbidden = ""
	r.mu.Unlock()
	return renewEvery, nil
}

// leaseWriteVerb is the verb a write of this replica's Lease on base uses
// (see write).
func leaseWriteVerb(base *coordinationv1.Lease) string {
	if base == nil {
		return "create"
	}
	return "update"
}

// leaseFailed records a failed request (verb) on this replica's own Lease.
// One that RBAC forbade is counted, every attempt (they back off), and
// kept for Status and readiness (see forbiddenLease) until a write
// succeeds. Any other error (an outage, a timeout) leaves what is known
// alone: it says nothing of whether RBAC still forbids the writes, and it
// hits every replica alike, which readiness must not turn into an empty
// Service.
func (r *replicaSet) leaseFailed(verb string, err error) {
	if !apierrors.IsForbidden(err) {
		return
	}
	certmetrics.ReplicaLeaseWriteForbidden(r.provider, verb)
	reason := fmt.Sprintf("RBAC forbids %s on this replica's Lease %s/%s (leases.coordination.k8s.io): the other replicas cannot see its announcements and do not wait for it before a successor CA signs", verb, r.namespace, r.leaseName)
	r.mu.Lock()
	r.forbidden = reason
	r.mu.Unlock()
}

// blind says why this process cannot see the other replicas' announcements,
// or "": their Leases could not be listed (RBAC) and no list has succeeded
// since, so it does not know who they all are or what they trust (see
// observation.blind).
func (r *replicaSet) blind() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.listForbidden {
		return "the replicas' Leases cannot be listed (RBAC forbids list on leases.coordination.k8s.io)"
	}
	if !r.listed && !r.listFailedSince.IsZero() && !r.unlistedLocked(r.clock.Now()) {
		return fmt.Sprintf("the replicas' Leases could not be listed since %s", r.listFailedSince.UTC().Format(time.RFC3339))
	}
	return ""
}

// forbiddenLease says which request on this replica's own Lease RBAC
// forbade last, naming the Lease and the verb; "" when none did since the
// last write that succeeded.
func (r *replicaSet) forbiddenLease() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.forbidden
}

// releaseTimeout bounds release: a process that is shutting down must not
// hang on an API server that does not answer. It is real time, not the
// Authority's clock: it bounds requests within the pod's termination grace
// period, which the kubelet measures in real time.
const releaseTimeout = 5 * time.Second

// releasedLeaseSeconds is the leaseDurationSeconds of a released Lease:
// the least the API accepts.
const releasedLeaseSeconds = 1

// release ends this replica's announcement when Run's context ends (a
// graceful shutdown), so that the other replicas stop waiting for it at
// once rather than a lease duration later, and no Lease is left behind
// for every rollout. It is best effort, bounded by releaseTimeout, and
// logs what failed: a replica that could not release its Lease ages out
// and is deleted by its peers later (collect), as after a crash.
//
// First the Lease's last announcement is written again, signed, with a
// lease duration of releasedLeaseSeconds: the other replicas believe it
// (a deletion alone is not evidence, anyone allowed to delete Leases could
// make them stop waiting for a live replica) and stop counting this
// replica as live once it has aged out. Then the Lease is deleted,
// conditional on that version, so a process that took over the same
// replica ID meanwhile keeps its Lease.
func (r *replicaSet) release(parent context.Context) {
	r.mu.Lock()
	base, key, renewedAt := r.own, r.ownKey, r.renewedAt
	r.mu.Unlock()
	if base == nil {
		return // never written, or deleted: nothing to release
	}
	logger := klog.FromContext(parent)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), releaseTimeout)
	defer cancel()
	leases := r.client.CoordinationV1().Leases(r.namespace)
	version := base.ResourceVersion
	if key != nil {
		lease := base.DeepCopy()
		renew := r.clock.Now().Truncate(time.Microsecond)
		if !renew.After(renewedAt) {
			renew = renewedAt.Add(time.Microsecond) // newer than the last: not a replay
		}
		lease.Spec.RenewTime = &metav1.MicroTime{Time: renew}
		lease.Spec.LeaseDurationSeconds = ptr.To(int32(releasedLeaseSeconds))
		delete(lease.Annotations, SignatureAnnotation)
		err := costly.sign(lease, key)
		if err == nil {
			lease, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		}
		if err != nil {
			logger.Info("Could not release this replica's Lease at shutdown; the other replicas wait for it until it ages out", "provider", r.provider,
				"lease", klog.KRef(r.namespace, r.leaseName), "err", describeLeaseError(err))
		} else {
			version = lease.ResourceVersion
		}
	}
	err := leases.Delete(ctx, r.leaseName, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &version}})
	switch {
	case err == nil:
		logger.V(2).Info("Deleted this replica's Lease at shutdown", "provider", r.provider, "lease", klog.KRef(r.namespace, r.leaseName))
	case apierrors.IsNotFound(err):
	case apierrors.IsForbidden(err):
		logger.Info("Cannot delete this replica's Lease at shutdown (RBAC: allow delete on leases.coordination.k8s.io); it stays until removed", "provider", r.provider,
			"lease", klog.KRef(r.namespace, r.leaseName), "err", err)
	default:
		logger.Info("Could not delete this replica's Lease at shutdown; the other replicas delete it once it has aged out", "provider", r.provider,
			"lease", klog.KRef(r.namespace, r.leaseName), "err", err)
	}
}

// write writes want, renewed at now and signed with key (unsigned when key
// is nil), into a copy of base (which keeps labels and annotations others
// set) with an Update carrying base's resourceVersion, or creates the
// Lease when base is nil, and returns the Lease as written.
func (r *replicaSet) write(ctx context.Context, base *coordinationv1.Lease, want announcement, key crypto.Signer, now time.Time) (*coordinationv1.Lease, error) {
	var lease *coordinationv1.Lease
	if base != nil {
		lease = base.DeepCopy()
	} else {
		lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.namespace, Name: r.leaseName}}
	}
	if lease.Labels == nil {
		lease.Labels = map[string]string{}
	}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Labels[LeaseLabel] = LeaseLabelValue(r.authority)
	lease.Annotations[TrustedCAsAnnotation] = want.trusted
	lease.Annotations[BundleHashAnnotation] = want.bundleHash
	lease.Annotations[LeafSerialAnnotation] = want.leafSerial
	lease.Annotations[LeafAnnotation] = want.leafPEM
	if want.clocksAhead != "" {
		lease.Annotations[ClocksAheadAnnotation] = want.clocksAhead
	} else {
		delete(lease.Annotations, ClocksAheadAnnotation)
	}
	if want.covered != "" {
		lease.Annotations[CoveredTargetsAnnotation] = want.covered
	} else {
		delete(lease.Annotations, CoveredTargetsAnnotation)
	}
	lease.Spec.HolderIdentity = ptr.To(r.id)
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(max(1, r.duration/time.Second)))
	lease.Spec.RenewTime = &metav1.MicroTime{Time: now}
	delete(lease.Annotations, SignatureAnnotation)
	if key != nil {
		if err := costly.sign(lease, key); err != nil {
			return nil, err
		}
	}
	leases := r.client.CoordinationV1().Leases(r.namespace)
	if base == nil {
		return leases.Create(ctx, lease, metav1.CreateOptions{})
	}
	return leases.Update(ctx, lease, metav1.UpdateOptions{})
}

func describeLeaseError(err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("forbidden (RBAC must allow get, list, watch, create and update on leases.coordination.k8s.io in this namespace; until then other replicas do not wait for this one): %w", err)
	}
	return err
}

// listOnce lists the other replicas' Leases once, before this process
// decides anything on the CA state: until then it knows no peer, and a
// replica whose clock is off would judge alone (Authority.clockSkew). The
// watch in run keeps them current afterwards. A list that fails is tried
// again at the next check, also one that RBAC forbids: until one succeeds
// this process is blind (see blind), and a single Lease the watch delivers
// does not say it knows them all; the watch reports the failures.
func (r *replicaSet) listOnce(ctx context.Context) {
	r.mu.Lock()
	done := r.listed && !r.listForbidden
	r.mu.Unlock()
	if done {
		return
	}
	selector := LeaseSelector(r.authority)
	list, err := r.client.CoordinationV1().Leases(r.namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		// The watch reports it (one failure, one message); here it only
		// decides whether to try again.
		klog.FromContext(ctx).V(2).Info("Listing replica leases failed", "provider", r.report.Provider(), "err", describeLeaseError(err))
		r.mu.Lock()
		if apierrors.IsForbidden(err) {
			r.listed, r.listForbidden = true, true
		} else if r.listFailedSince.IsZero() {
			r.listFailedSince = r.clock.Now()
		}
		r.mu.Unlock()
		return
	}
	for n := range list.Items {
		r.observe(&list.Items[n])
	}
	r.mu.Lock()
	r.listed, r.listForbidden, r.listFailedSince = true, false, time.Time{}
	r.mu.Unlock()
}

// watch keeps seen up to date from an informer on the Leases of this
// Authority, and kicks the issuer when an announcement changes.
func (r *replicaSet) watch(ctx context.Context, kick func()) {
	selector := LeaseSelector(r.authority)
	leases := r.client.CoordinationV1().Leases(r.namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			return leases.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			return leases.Watch(ctx, opts)
		},
	}
	informer := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, r.client), &coordinationv1.Lease{}, cache.SharedIndexInformerOptions{})
	_ = informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || ctx.Err() != nil {
			return
		}
		_ = r.watchReport.failed(fmt.Errorf("watching replica leases in %s: %w", r.namespace, describeLeaseError(err)))
	})
	onChange := func(obj any) {
		if l, ok := obj.(*coordinationv1.Lease); ok && r.observe(l) {
			kick()
		}
	}
	_, _ = informer.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    onChange,
		UpdateFunc: func(_, obj any) { onChange(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if l, ok := obj.(*coordinationv1.Lease); ok {
				r.deleted(l)
				kick()
			}
		},
	}, cache.HandlerOptions{})
	informer.RunWithContext(ctx)
}

// consumersMayLack reports whether the consumers of this replica's bundle
// (a bundle file in its pod, a sidecar, clients that fetched it) may lack
// ca although this process found it in the Secret when it started: the pod
// ran before (its previous process's Lease, under this replica's ID, is
// still there: its container was restarted) and that process's believed
// announcement did not hold ca. The pod's consumers kept what they had and
// need the full minimum delay from now. Anything else counts as a new pod,
// whose consumers read the bundle at start: no Lease of its own (a
// rollout, a scale-up, a graceful restart, which deletes its Lease), the
// Leases not listed yet or not listable (an API error, RBAC: a replica must
// not sit out the delay, NotReady, for an error of the API server's), or a
// Lease under its name that is not believed (someone with Lease write must
// not hold it back). So a Deployment rolled out more often than the delay
// never stalls a rotation (issue 27), while a container that crash-loops
// faster than the delay holds it back, visibly (Stalled), since its pod's
// consumers never had the successor for long. Call it before this
// process's first write.
func (r *replicaSet) consumersMayLack(ca *x509.Certificate) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.seen[r.leaseName]
	if !r.listed || r.listForbidden || prev == nil || prev.deleted || r.written != (announcement{}) {
		return false
	}
	return !slices.Contains(prev.trusted, Fingerprint(ca))
}

// deleted records that the Lease l was deleted: its replica is still waited
// for until the Lease would have aged out (collect forgets it then).
func (r *replicaSet) deleted(l *coordinationv1.Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.seen[l.Name]; s != nil {
		s.deleted, s.rv = true, ""
	} else {
		r.forgetAnnouncementLocked(l.Name) // never believed
	}
	delete(r.held, l.Name)
	delete(r.judgedVersion, l.Name)
	if l.Name == r.leaseName {
		r.own = nil // the next write creates it
	}
}

// observe records a Lease and reports whether what it announces changed.
// Only an announcement that is believed (see judgeLocked) is recorded:
// one that is not leaves the last one believed for the Lease in place,
// ageing out as if the replica had stopped renewing.
func (r *replicaSet) observe(l *coordinationv1.Lease) bool {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if l.Name == r.leaseName && r.own == nil {
		// This replica's Lease, before this process wrote it (a fixed
		// ReplicaID, restarted): the first renewal updates it.
		r.own = l
	}
	return r.observeLocked(l, now)
}

// observeLocked is observe with r.mu held; seenAt is when this process saw
// l (before now for a Lease held until the Secret was read).
func (r *replicaSet) observeLocked(l *coordinationv1.Lease, seenAt time.Time) bool {
	holder := l.Name
	if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
		holder = *l.Spec.HolderIdentity
	}
	duration := r.duration
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	var trusted, ahead, covered []string
	for _, t := range strings.Split(l.Annotations[CoveredTargetsAnnotation], "\n") {
		if t = cleanTarget(t); t != "" {
			covered = append(covered, t)
		}
	}
	if v := l.Annotations[TrustedCAsAnnotation]; v != "" {
		trusted = strings.Split(v, ",")
	}
	if v := l.Annotations[ClocksAheadAnnotation]; v != "" {
		ahead = strings.Split(v, ",")
	}
	// A renewal is a new resourceVersion or a new renewTime (clients that
	// do not bump resourceVersions, and relists that repeat an object,
	// are both handled).
	version := l.ResourceVersion
	if l.Spec.RenewTime != nil {
		version += "/" + l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	}
	prev := r.seen[l.Name]
	if prev != nil && prev.rv == version || r.judgedVersion[l.Name] == version {
		return false
	}
	v := r.judgeLocked(l)
	if v.rejected != nil {
		r.judgedVersion[l.Name] = version
		if v.rejected.hold {
			r.held[l.Name] = heldLease{lease: l, seenAt: seenAt, unlisted: v.rejected.unlisted}
		} else {
			delete(r.held, l.Name)
		}
		r.rejectLocked(l, v.rejected)
		return false
	}
	delete(r.held, l.Name)
	delete(r.judgedVersion, l.Name)
	r.marks[l.Name] = r.marks[l.Name].next(v.leaf, v.renew, v.sig, r.rootsGen)
	observedAt := seenAt
	if prev == nil && l.Spec.RenewTime != nil {
		// First sight: a Lease left behind by a replica that is gone
		// (killed, or its delete failed) would count as live for a whole
		// duration from now, and hold every rotation for as long as
		// processes start more often than that (a Deployment rolled out
		// every few minutes). Its renewTime says how much of the duration
		// it has left, as far as the clocks agree (the skew tolerance):
		// never less than it has (a replica that cannot renew just now is
		// still waited for as long as its Lease holds), and at least two
		// renewal intervals and the tolerance, for a clock far ahead,
		// which sees its live peers renew by then. A large tolerance
		// leaves little to gain: then the whole duration counts.
		// The tolerance in left already allows for the clocks' offset (one
		// reading of the holder's clock, not a duration measured on ours),
		// so the margin waitedForLocked adds is taken back here: a renewal
		// first seen waits at most what one watched being made does.
		margin := leaseMargin(duration, r.skew)
		left := l.Spec.RenewTime.Add(r.skew + duration).Sub(seenAt)
		left = min(duration+margin, max(left, 2*duration/3+r.skew))
		observedAt = seenAt.Add(left - duration - margin)
	}
	s := &seenLease{holder: holder, trusted: trusted, rv: version, version: l.ResourceVersion, observedAt: observedAt, duration: duration,
		leaf: v.leaf, clocksAhead: ahead, firstSeen: prev == nil, bundleHash: l.Annotations[BundleHashAnnotation], covered: covered,
		writtenAt: serverWriteTime(l)}
	if s.firstSeen {
		s.firstSeenAt = seenAt
	}
	if l.Spec.RenewTime != nil {
		s.renewTime = l.Spec.RenewTime.Time
	}
	s.delta, s.hasDelta = l.Spec.RenewTime.Sub(seenAt), true
	r.seen[l.Name] = s
	r.expireDeadOnServerLocked(s.writtenAt, seenAt)
	// What the issuer decides on changed: what the replica trusts, or how
	// its clock compares with ours (see clocksLocked), or is known again
	// after a pause.
	return prev == nil || prev.stale || prev.duration != duration || !slices.Equal(prev.trusted, trusted) || !slices.Equal(prev.covered, covered) || r.leafWatched && !sameLeaf(prev.leaf, s.leaf) || !slices.Equal(prev.clocksAhead, ahead) || r.clockClass(prev) != r.clockClass(s)
}

// serverWriteTime is when the API server last applied a change to l, on
// the server's clock: the latest time of l's managedFields entries, which
// the server stamps on every write that changes a field (a renewal
// changes renewTime). Zero when l has none (a client that strips them, a
// fake).
func serverWriteTime(l *coordinationv1.Lease) time.Time {
	var t time.Time
	for _, e := range l.ManagedFields {
		if e.Time != nil && e.Time.After(t) {
			t = e.Time.Time
		}
	}
	return t
}

// expireDeadOnServerLocked dates every Lease seen only in the version this
// process saw first (a list at start, never a renewal it watched) no later
// than its last write on the API server's clock, as of at: newest, a later
// write in the same stream of Leases, is the server's clock when it was
// made, so the Lease was written newest - writtenAt before at at least
// (plus the tolerance for API servers whose clocks differ). A Lease that
// age shows unrenewed for its duration and margins is then dead, and one
// unrenewed for leaseGCAfter durations is collected. The
// first-sight floor in observeLocked (two renewal intervals and the
// tolerance, for a clock of this process's far ahead) otherwise lets the
// Lease of a killed replica hold every rotation and emergency for as long
// as a rollout replaces each process before it lives through the floor
// (issue 27 §1); the server's clock tells its age whatever this process's
// clock says, and the stream is ordered, so no later renewal of the Lease
// can have been missed while a later write was seen.
//
// The managedFields times are not signed: someone with Lease write rights
// can set them, or write back an old version with its old times. So the
// rule also needs the renewTime the holder signed to be past duration and
// tolerance on this process's clock, and still waits two renewal
// intervals from first sight, within which a live replica's renewal
// undoes a replay: forged times take away only the skew tolerance of the
// floor. A Lease whose renewal may still be on its way after a pause of
// this process (stale: a relist delivers the Leases in name order, not in
// the order of their writes) is left to the floor. r.mu must be held.
func (r *replicaSet) expireDeadOnServerLocked(newest, at time.Time) {
	if newest.After(r.newestWrite) {
		r.newestWrite = newest
	}
	if r.newestWrite.IsZero() {
		return
	}
	for _, l := range r.seen {
		if !l.firstSeen || l.stale || l.deleted || l.writtenAt.IsZero() || l.renewTime.IsZero() {
			continue
		}
		if at.Sub(l.renewTime) > l.duration+r.skew {
			// It was written age ago at least, on the server's clock;
			// the tolerance allows for API servers whose clocks differ.
			age := r.newestWrite.Sub(l.writtenAt)
			// Still waited for two renewal intervals from first sight:
			// an old version written back (a replay, its old times put
			// back too) is undone by the live replica's next renewal,
			// which comes within one.
			floor := l.firstSeenAt.Add(2*l.duration/3 - l.duration - leaseMargin(l.duration, r.skew))
			l.observedAt = earliest(l.observedAt, latest(at.Add(r.skew-age), floor))
		}
	}
}

// peerClocks is how the live replicas' clocks compare with this one's, as
// their Lease renewals show them; see Authority.clockSkew for the rule.
type peerClocks struct {
	// live counts the live replicas other than this one.
	live int
	// ahead are the live replicas whose renewals show their clocks ahead
	// of ours beyond the tolerance; behind those whose renewals show them
	// behind beyond it even allowing a renewal interval for the renewal to
	// be seen, or that announce our clock as ahead of theirs.
	ahead, behind []string
	// deltas are the live replicas' deltas (see seenLease.delta).
	deltas []time.Duration
	// stale are the live replicas whose last renewal was seen before this
	// process stopped watching for longer than the tolerance (a pause, or
	// a jump of its clock): until their next renewal, nothing tells
	// whether this clock still agrees with theirs.
	stale []string
}

// clockClass is 1 when l's clock is ahead of ours beyond the tolerance, -1
// when behind beyond it (allowing a renewal interval), else 0.
func (r *replicaSet) clockClass(l *seenLease) int {
	switch {
	case !l.hasDelta:
		return 0
	case l.delta > r.skew:
		return 1
	case l.delta+l.duration/3 < -r.skew && !l.firstSeen:
		return -1
	}
	return 0
}

// clocks compares the live replicas' clocks with this one's at now.
func (r *replicaSet) clocks(now time.Time) peerClocks {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clocksLocked(now)
}

// clocksLocked is clocks with r.mu held. This replica's own Lease, under
// today's name or an older version's, is not a peer.
func (r *replicaSet) clocksLocked(now time.Time) peerClocks {
	var v peerClocks
	unseen := r.unseenLocked(now)
	for name, l := range r.seen {
		if name == r.leaseName || l.holder == r.id || l.deleted || !now.Before(l.observedAt.Add(l.duration+unseen)) {
			continue
		}
		v.live++
		if l.stale || unseen > r.skew {
			v.stale = append(v.stale, l.holder)
			continue
		}
		if l.hasDelta {
			v.deltas = append(v.deltas, l.delta)
		}
		switch {
		case r.clockClass(l) > 0:
			v.ahead = append(v.ahead, l.holder)
		case r.clockClass(l) < 0, slices.Contains(l.clocksAhead, r.id):
			v.behind = append(v.behind, l.holder)
		}
	}
	slices.Sort(v.ahead)
	slices.Sort(v.behind)
	slices.Sort(v.stale)
	return v
}

// replicaLeaseName is the name of the Lease replica id of the Authority of
// Secret authority announces itself in: "<authority>-<id>", cut and made a
// valid DNS-1123 label for readability, then "-" and 16 hex digits of the
// SHA-256 of the pair. The hash makes the name injective: without it,
// Secret "a" with replica "b-c" and Secret "a-b" with replica "c" both
// wrote Lease "a-b-c" and overwrote each other's announcements. The name
// is at most 63 characters.
//
// Versions before the hash named the Lease "<authority>-<id>". Leases
// under those names keep the Authority's label, so replicas of either
// version still read them as announcements during a rolling upgrade; once
// an old replica stops renewing its Lease, that Lease stops counting as
// live after its duration and is deleted like any replica's that is gone
// (see collect).
func replicaLeaseName(authority, id string) string {
	sum := sha256.Sum256([]byte(authority + "\x00" + id))
	suffix := "-" + hex.EncodeToString(sum[:8])
	readable := []byte(strings.ToLower(authority + "-" + id))
	for i, c := range readable {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			readable[i] = '-'
		}
	}
	prefix := string(readable[:min(len(readable), validation.DNS1123LabelMaxLength-len(suffix))])
	prefix = strings.TrimRight(strings.TrimLeft(prefix, "-"), "-")
	if prefix == "" {
		prefix = "replica"
	}
	return prefix + suffix
}

// LeaseLabelValue is the value of LeaseLabel on the
// Leases of the replicas of the Authority whose CA Secret is secretName:
// always a valid label value, so the Leases can be written and listed.
//
// A name that is a valid label value (every Secret name of up to 63
// characters) is its own value, as in every earlier version, so replicas
// of either version see each other during a rolling upgrade. Any other
// name (a Secret name of 64 to 253 characters, which the API server
// accepts for a Secret but refuses in a label, so every Lease write and
// list failed) becomes its first characters, made valid and cut so the
// value fits, then "-" and 16 hex digits of the SHA-256 of the whole
// name: at most 63 characters, readable, and distinct for distinct names.
func LeaseLabelValue(secretName string) string {
	if len(validation.IsValidLabelValue(secretName)) == 0 {
		return secretName
	}
	sum := sha256.Sum256([]byte(secretName))
	suffix := hex.EncodeToString(sum[:8])
	readable := []byte(secretName)
	for i, c := range readable {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' && c != '.' {
			readable[i] = '-'
		}
	}
	readable = readable[:min(len(readable), validation.LabelValueMaxLength-len(suffix)-1)]
	// A label value starts and ends with an alphanumeric character.
	prefix := strings.Trim(string(readable), "-_.")
	if prefix == "" {
		return suffix
	}
	return prefix + "-" + suffix
}

// LeaseSelector is the label selector of the Leases of the
// replicas of the Authority whose CA Secret is secretName.
func LeaseSelector(secretName string) string {
	return labels.SelectorFromSet(labels.Set{LeaseLabel: LeaseLabelValue(secretName)}).String()
}

// defaultReplicaID names this process: the host name (the pod name in a
// cluster) and a random suffix, so that two processes never share a Lease.
func defaultReplicaID(hostname string, random string) string {
	id := strings.ToLower(hostname)
	if errs := validation.IsDNS1123Subdomain(id); len(errs) > 0 || id == "" {
		id = "replica"
	}
	return id + "-" + random
}
