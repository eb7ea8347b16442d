package cabundle

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/pki"
)

// This file holds contested tracking: noticing that another writer keeps
// changing a caBundle the publisher writes, holding the publisher's writes
// back with a backoff while it does, and clearing it once a write sticks
// (report.go logs and sends Events). The policy, documented in the package
// documentation:
const (
	// contestReverts changes of a published caBundle away from the
	// published bundle, by a write that is not the publisher's, within
	// contestWindow make the object contested. One or two (kubectl edit, a
	// Helm upgrade) are drift, repaired at once.
	contestReverts = 3
	contestWindow  = 5 * time.Minute

	// While contested, the publisher writes at most once per backoff delay:
	// contestInitialDelay doubling up to contestMaxDelay, each lengthened by
	// up to backoff.Jitter at random.
	contestInitialDelay = 5 * time.Second
	contestMaxDelay     = 5 * time.Minute

	// A contested object is clear again once the published bundle has held
	// (no change away from it) for contestQuiet, or, if longer, for the
	// delay the publisher waited before its last write: a write that stands
	// as long as the other writer was given to react has stuck.
	contestQuiet = 30 * time.Second
)

// contestView is a snapshot of one object's contest.
type contestView struct {
	contested bool
	// cause says why the object became contested.
	cause string
	// manager names the other writer(s) as far as known, "" if unknown.
	manager string
	since   time.Time
	// reverts counts the changes away from the bundle within the window.
	reverts int
	// wait is how long until the next write is allowed; 0 means now.
	wait time.Duration
}

// contestState is the contest bookkeeping of one object.
type contestState struct {
	reverts   []time.Time // changes away from the bundle, within the window
	manager   string
	contested bool
	cause     string
	since     time.Time
	delays    *backoff.Backoff
	nextWrite time.Time     // no write before
	lastDelay time.Duration // the delay that set nextWrite
	calmSince time.Time     // the last change away or write, whichever is later
	mustHold  time.Duration // how long after calmSince the bundle must hold to clear
	// replicaAheadSince is when the object was first seen holding a later
	// step of our CA rotation written by another replica; zero when it
	// does not (see waitForReplica).
	replicaAheadSince time.Time
}

// contests tracks, by object key, the objects whose caBundle another writer
// keeps changing. It is the one owner of that state; its methods are safe
// for concurrent use and take the time from the publisher's clock.
type contests struct {
	clock   clock.PassiveClock
	mu      sync.Mutex
	objects map[string]*contestState
}

// replicaGrace is how long a publisher leaves alone a caBundle that another
// replica of it (its own field manager) wrote from a source a step ahead in
// the same CA rotation, for its own source to catch up, before it writes
// its own bundle over it. Replicas that read one CA Secret through a watch
// see a rotation step within moments of each other; a source stuck behind
// for longer then writes, and the replicas ahead treat that as any other
// writer (contested tracking).
const replicaGrace = 10 * time.Second

func newContests(c clock.PassiveClock) *contests {
	return &contests{clock: c, objects: make(map[string]*contestState)}
}

// waitForReplica records that key holds a later step of our CA rotation
// written by another replica, and returns how much of replicaGrace, counted
// from when this was first seen, is left; 0 once it is over.
func (c *contests) waitForReplica(key string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	s := c.state(key)
	if s.replicaAheadSince.IsZero() {
		s.replicaAheadSince = now
	}
	return max(0, replicaGrace-now.Sub(s.replicaAheadSince))
}

// replicaCaughtUp records that key no longer holds a later step of our CA
// rotation from another replica: the next time it does, the grace starts
// anew.
func (c *contests) replicaCaughtUp(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.objects[key]; ok {
		s.replicaAheadSince = time.Time{}
	}
}

// view returns the snapshot of s at now; s must be locked.
func (s *contestState) view(now time.Time) contestView {
	v := contestView{contested: s.contested, cause: s.cause, manager: s.manager, since: s.since, reverts: len(s.reverts)}
	if s.contested && now.Before(s.nextWrite) {
		v.wait = s.nextWrite.Sub(now)
	}
	return v
}

// start makes s contested at now; the first write waits one delay.
func (s *contestState) start(now time.Time, cause string) {
	s.contested = true
	s.cause = cause
	s.since = now
	s.delays = backoff.New(contestInitialDelay, contestMaxDelay)
	s.lastDelay = s.delays.Next(nil)
	s.nextWrite = now.Add(s.lastDelay)
	s.calmSince = now
	s.mustHold = contestQuiet
}

func (c *contests) state(key string) *contestState {
	s, ok := c.objects[key]
	if !ok {
		s = &contestState{}
		c.objects[key] = s
	}
	return s
}

// revert records that a write that is not the publisher's changed key's
// caBundle away from the published bundle. started is true when that made
// the object contested.
func (c *contests) revert(key, manager string) (started bool, v contestView) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	s := c.state(key)
	s.reverts = slices.DeleteFunc(s.reverts, func(t time.Time) bool { return now.Sub(t) >= contestWindow })
	s.reverts = append(s.reverts, now)
	if manager != "" {
		s.manager = manager
	}
	if s.contested {
		s.calmSince = now
		return false, s.view(now)
	}
	if len(s.reverts) < contestReverts {
		return false, s.view(now)
	}
	s.start(now, fmt.Sprintf("changed away from the published bundle %d times within %v", len(s.reverts), contestWindow))
	return true, s.view(now)
}

// conflict records that a server-side apply without force conflicted with
// managers, which makes the object contested at once.
func (c *contests) conflict(key, managers string) (started bool, v contestView) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	s := c.state(key)
	if managers != "" {
		s.manager = managers
	}
	if s.contested {
		s.calmSince = now
		return false, s.view(now)
	}
	s.start(now, "server-side apply conflict: another field manager owns the caBundle")
	return true, s.view(now)
}

// gate returns the contest of key, whose wait says how long a write must
// still be held back.
func (c *contests) gate(key string) contestView {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.objects[key]
	if !ok {
		return contestView{}
	}
	return s.view(c.clock.Now())
}

// wrote records a successful write to a contested key: the next one waits
// one more (longer) delay. It returns how long this write must hold for the
// contest to clear.
func (c *contests) wrote(key string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.objects[key]
	if !ok || !s.contested {
		return 0
	}
	now := c.clock.Now()
	s.mustHold = max(contestQuiet, s.lastDelay)
	s.lastDelay = s.delays.Next(nil)
	s.nextWrite = now.Add(s.lastDelay)
	s.calmSince = now
	return s.mustHold
}

// settle is told that key holds the published bundle. A contested key is
// cleared (cleared true, its bookkeeping dropped) when it has held long
// enough; otherwise wait says when to look again.
func (c *contests) settle(key string) (cleared bool, wait time.Duration, v contestView) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.objects[key]
	if !ok || !s.contested {
		return false, 0, contestView{}
	}
	now := c.clock.Now()
	if held := now.Sub(s.calmSince); held < s.mustHold {
		return false, s.mustHold - held, s.view(now)
	}
	v = s.view(now)
	delete(c.objects, key)
	return true, 0, v
}

// forget drops the bookkeeping of key (the object was deleted).
func (c *contests) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.objects, key)
}

// keyedContest is a contested object with its key.
type keyedContest struct {
	key string
	contestView
}

// contested lists the contested objects, sorted by key.
func (c *contests) contested() []keyedContest {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	var out []keyedContest
	for k, s := range c.objects {
		if s.contested {
			out = append(out, keyedContest{k, s.view(now)})
		}
	}
	slices.SortFunc(out, func(a, b keyedContest) int { return strings.Compare(a.key, b.key) })
	return out
}

// Contested returns the objects whose caBundle is contested now, as
// "Kind/name", sorted: another writer keeps changing it, and the publisher
// is backing off (see the package documentation).
func (p *Publisher) Contested() []string {
	var out []string
	for _, c := range p.contests.contested() {
		out = append(out, c.key)
	}
	return out
}

// detectRevert runs in t's informer event handler on every update of an
// object: a selected caBundle field that held the published bundle and no
// longer does was changed by a write that is not the publisher's (it only
// ever writes the published bundle). Only the first target selecting the
// object counts, so that an object two targets select counts once.
func (p *Publisher) detectRevert(t *targetState, old, cur objectView) {
	for _, o := range p.targets[:t.index] {
		if o.Kind == t.Kind && o.selects(cur.name, cur.labels) {
			return
		}
	}
	bundle := p.source.CurrentCABundleContent()
	if len(bundle) == 0 {
		return
	}
	to := changesAway(p.selectedSlots(t.Kind, old), p.selectedSlots(t.Kind, cur), bundle)
	if len(to) == 0 {
		return
	}
	if p.byOwnReplica(to, bundle) {
		// A replica of our Authority, a step ahead or behind: it announces
		// that bundle in its Lease. Counting it made one Authority's
		// replicas contest each other whenever one read the CA Secret
		// later than the grace (issue 27).
		p.logger.V(2).Info("caBundle changed by another replica of our Authority; not another writer",
			"kind", t.Kind, "name", cur.name)
		return
	}
	if p.byReplicaAhead(cur, to, bundle) {
		// Replicas see a rotation step at slightly different times; this
		// is one ahead of us, not another writer (publish waits for our
		// source to catch up). Counting it made one rotation step with
		// three replicas contested, health failing, for 30 s.
		p.logger.V(2).Info("caBundle changed by another replica whose source is ahead in the same CA rotation; not another writer",
			"kind", t.Kind, "name", cur.name)
		return
	}
	manager := otherWriter(cur, p.fieldManager)
	if lastWriterIsOurs(cur, p.fieldManager) {
		// Our own field manager, with a bundle that is no later step of
		// our rotation: a replica whose source is stuck, or a second
		// installation sharing the field manager.
		manager = p.fieldManager + " (another replica or publisher with the same field manager)"
	}
	started, g := p.contests.revert(objectKey(t.Kind, cur.name), manager)
	p.logger.V(2).Info("caBundle changed away from the published bundle by another writer",
		"kind", t.Kind, "name", cur.name, "otherWriter", orUnknown(manager), "changesInWindow", g.reverts)
	if started {
		p.reportContested(t.adapter, cur, g)
	}
}

// changesAway returns what the slots that held bundle in old and hold
// something else in cur hold now, in cur's order; nil when there are none.
// Slots are matched by webhook name (or path).
func changesAway(old, cur []slot, bundle []byte) [][]byte {
	key := func(s slot) string {
		if s.webhook != "" {
			return s.webhook
		}
		return s.path
	}
	held := make(map[string]bool, len(old))
	for _, s := range old {
		if bytes.Equal(s.current, bundle) {
			held[key(s)] = true
		}
	}
	var out [][]byte
	for _, s := range cur {
		if held[key(s)] && !bytes.Equal(s.current, bundle) {
			out = append(out, s.current)
		}
	}
	return out
}

// byReplicaAhead reports whether values, what v's fields hold instead of
// bundle, were written by another replica of this publisher whose source is
// a step ahead of ours in the same CA rotation: our field manager wrote a
// caBundle of v last, every value is a later step of bundle's rotation, and
// no value fails to verify a chain served now that bundle verifies. A
// different field manager is never excused, whatever it writes; neither is
// a value that would leave a server's clients failing their handshakes
// for the grace.
func (p *Publisher) byReplicaAhead(v objectView, values [][]byte, bundle []byte) bool {
	return lastWriterIsOurs(v, p.fieldManager) && aheadInRotation(values, bundle) && !p.breaksServed(values, bundle)
}

// replicaBundles is implemented by a Source whose replicas announce the
// bundles they hold (authority.Authority, through its Leases):
// AnnouncesCABundle reports whether a live replica announces bundle, byte
// for byte.
type replicaBundles interface {
	AnnouncesCABundle(bundle []byte) bool
}

// byOwnReplica reports whether values, what the object's fields hold
// instead of bundle, were written by replicas of our own source: each is
// the bundle a live replica announces (replicaBundles), whatever field
// manager wrote it, and none fails to verify a chain served now that bundle
// verifies. Such a value is a step of the same CA rotation that one replica
// saw before another (the source keeps a successor from signing until
// every live replica holds it), not another writer's. A value no live
// replica announces is judged as before (byReplicaAhead, contested
// tracking).
func (p *Publisher) byOwnReplica(values [][]byte, bundle []byte) bool {
	rb, ok := p.source.(replicaBundles)
	if !ok || len(values) == 0 {
		return false
	}
	now := p.clock.Now()
	for _, v := range values {
		if !rb.AnnouncesCABundle(v) || !holdsValidCA(v, now) {
			// A value whose every CA has expired verifies nothing: after
			// an unsafe rotation (every replica paused past the CAs' end)
			// the replicas' Leases still announce it until they renew,
			// and holding it back would fail every client of the new CA.
			return false
		}
	}
	return !p.breaksServed(values, bundle)
}

// holdsValidCA reports whether the PEM bundle v holds a CA valid at now.
func holdsValidCA(v []byte, now time.Time) bool {
	certs, err := pki.ParseCABundle(v)
	if err != nil {
		return false
	}
	for _, c := range certs {
		if !now.Before(c.NotBefore) && now.Before(c.NotAfter) {
			return true
		}
	}
	return false
}

// aheadOfAll reports whether bundle is a later step of the CA rotation
// than each of values (aheadInRotation): a publisher whose bundle is ahead
// writes it over another replica's, which then leaves it alone
// (byOwnReplica), so that the rotation moves at the pace of the replica
// ahead.
func aheadOfAll(bundle []byte, values [][]byte) bool {
	for _, v := range values {
		if !aheadInRotation([][]byte{bundle}, v) {
			return false
		}
	}
	return len(values) > 0
}

// breaksServed reports whether one of values fails to verify a chain that a
// server serves now (PublisherConfig.Verify) which bundle verifies: a
// replica whose source dropped the CA that this server's leaf still chains
// to. False without Verify.
func (p *Publisher) breaksServed(values [][]byte, bundle []byte) bool {
	now := p.clock.Now()
	for _, c := range p.servedChains() {
		one := []dynamiccert.ServedChain{c}
		if verifyFields([][]byte{bundle}, one, now) == nil && verifyFields(values, one, now) != nil {
			return true
		}
	}
	return false
}

// lastWriterIsOurs reports whether ours is the field manager that wrote a
// caBundle field of v last: it owns one, and every other owner's entry is
// older. managedFields times have a resolution of one second; a tie is not
// ours, so that another writer is never taken for a replica.
func lastWriterIsOurs(v objectView, ours string) bool {
	var oursAt, othersAt time.Time
	owned, others := false, false
	for _, o := range v.owners {
		if o.manager == ours {
			owned = true
			if o.time.After(oursAt) {
				oursAt = o.time
			}
		} else {
			others = true
			if o.time.After(othersAt) {
				othersAt = o.time
			}
		}
	}
	return owned && (!others || oursAt.After(othersAt))
}

// aheadInRotation reports whether every one of values is a later step than
// bundle of the same CA rotation ([A] -> [A B] -> [B]), in which a CA joins
// newer than every CA before it and leaves older than every CA that stays.
// A later step shares a CA certificate with bundle (the bundles of
// unrelated CAs share none), differs from it in the set of CAs, every CA it
// adds is newer (by NotBefore) than all of bundle's, and every CA of bundle
// it drops is older than every one it keeps. So a bundle that swapped a CA
// for another ([A B] -> [A C]), or dropped a newer CA and kept an older one
// (a rollback), is no later step. An empty, unparsable or unrelated value
// is no later step; neither is none at all.
func aheadInRotation(values [][]byte, bundle []byte) bool {
	ours, err := pki.ParseCABundle(bundle)
	if err != nil || len(values) == 0 {
		return false
	}
	oursSet := make(map[string]*x509.Certificate, len(ours))
	for _, c := range ours {
		oursSet[string(c.Raw)] = c
	}
	_, oursNewest := notBeforeRange(ours)
	for _, v := range values {
		certs, err := pki.ParseCABundle(v)
		if err != nil {
			return false
		}
		theirs := make(map[string]bool, len(certs))
		var kept, added, dropped []*x509.Certificate
		for _, c := range certs {
			if theirs[string(c.Raw)] {
				continue
			}
			theirs[string(c.Raw)] = true
			if oursSet[string(c.Raw)] != nil {
				kept = append(kept, c)
			} else {
				added = append(added, c)
			}
		}
		for raw, c := range oursSet {
			if !theirs[raw] {
				dropped = append(dropped, c)
			}
		}
		oldestAdded, _ := notBeforeRange(added)
		_, newestDropped := notBeforeRange(dropped)
		oldestKept, _ := notBeforeRange(kept)
		switch {
		case len(kept) == 0:
			return false // unrelated CAs
		case len(added) == 0 && len(dropped) == 0:
			return false // the same CAs
		case len(added) > 0 && !oldestAdded.After(oursNewest):
			return false // a CA joined that is no successor of ours
		case len(dropped) > 0 && !newestDropped.Before(oldestKept):
			return false // a CA left that is not older than those that stay
		}
	}
	return true
}

// notBeforeRange returns the earliest and the latest NotBefore of certs;
// zero times when there are none.
func notBeforeRange(certs []*x509.Certificate) (oldest, newest time.Time) {
	for i, c := range certs {
		if i == 0 || c.NotBefore.Before(oldest) {
			oldest = c.NotBefore
		}
		if c.NotBefore.After(newest) {
			newest = c.NotBefore
		}
	}
	return oldest, newest
}

// otherWriter names the manager that last wrote a caBundle field of v,
// other than ours; "" if there is none.
func otherWriter(v objectView, ours string) string {
	var best fieldOwner
	for _, o := range v.owners {
		if o.manager != ours && (best.manager == "" || o.time.After(best.time)) {
			best = o
		}
	}
	return best.manager
}

func orUnknown(manager string) string {
	if manager == "" {
		return "unknown"
	}
	return manager
}

// settle clears the contest of an object that holds the bundle once it has
// held it long enough, and returns when to look again if not yet.
func (p *Publisher) settle(t *targetState, v objectView) time.Duration {
	cleared, wait, g := p.contests.settle(objectKey(t.Kind, v.name))
	if cleared {
		p.reportUncontested(t.adapter, v, g)
	}
	return wait
}
