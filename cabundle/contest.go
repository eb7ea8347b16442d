package cabundle

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/backoff"
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
}

// contests tracks, by object key, the objects whose caBundle another writer
// keeps changing. It is the one owner of that state; its methods are safe
// for concurrent use and take the time from the publisher's clock.
type contests struct {
	clock   clock.PassiveClock
	mu      sync.Mutex
	objects map[string]*contestState
}

func newContests(c clock.PassiveClock) *contests {
	return &contests{clock: c, objects: make(map[string]*contestState)}
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
	if len(bundle) == 0 || !changedAway(p.selectedSlots(t.Kind, old), p.selectedSlots(t.Kind, cur), bundle) {
		return
	}
	manager := otherWriter(cur, p.fieldManager)
	started, g := p.contests.revert(objectKey(t.Kind, cur.name), manager)
	p.logger.V(2).Info("caBundle changed away from the published bundle by another writer",
		"kind", t.Kind, "name", cur.name, "otherWriter", orUnknown(manager), "changesInWindow", g.reverts)
	if started {
		p.reportContested(t.adapter, cur, g)
	}
}

// changedAway reports whether a slot that held bundle in old holds
// something else in cur. Slots are matched by webhook name (or path).
func changedAway(old, cur []slot, bundle []byte) bool {
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
	for _, s := range cur {
		if held[key(s)] && !bytes.Equal(s.current, bundle) {
			return true
		}
	}
	return false
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
