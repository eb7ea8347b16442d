package cabundle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/internal/certmetrics"
)

// This file holds the work queue's worker: it takes a target off the queue,
// compares its objects in the informer cache with the bundle, and writes
// what differs, unless contested tracking (contest.go) holds the write back.

// Result values of evercert_cabundle_publish_total.
const (
	resultSuccess   = "success"
	resultUnchanged = "unchanged"
	resultConflict  = "conflict"
	resultError     = "error"
	resultContested = "contested"
	// resultReplicaAhead: the write was held back because another replica
	// of this publisher, a step ahead in the same CA rotation, wrote last.
	resultReplicaAhead = "replica_ahead"
	// resultOwnReplica: the write was held back because the object holds
	// the bundle a live replica of the same Authority announces (see
	// replicaBundles): a step ahead or behind in the CA rotation, never a
	// contest.
	resultOwnReplica = "own_replica"
)

// sourceKey is the key, in Publisher.logs, of the wait for the source to
// have a bundle.
const sourceKey = "source"

// processNext works on one target; it returns false once the queue is shut
// down. A failed write is retried after the target's backoff; a target that
// asked to be looked at again later (a contested object waiting for its
// next write, or for its write to prove that it sticks) is queued after
// that delay. Both wait on the publisher's clock.
func (p *Publisher) processNext(ctx context.Context) bool {
	i, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(i)
	t := p.targets[i]
	after, err := p.syncTarget(ctx, t)
	if ctx.Err() != nil {
		return true
	}
	if err != nil {
		p.queue.AddAfter(i, t.retry.Next(err))
	} else {
		t.retry.Reset()
	}
	if after > 0 {
		p.queue.AddAfter(i, after)
	}
	return true
}

// syncTarget publishes to every object of t that needs it. It returns an
// error (already counted and logged) when any write failed, so that the
// target is retried with backoff, and after > 0 when the target must be
// looked at again after that long even without an event.
func (p *Publisher) syncTarget(ctx context.Context, t *targetState) (after time.Duration, err error) {
	if !t.informer.HasSynced() {
		// Queued by an event of the initial list; the waiter in Run queues
		// the target again once the list is complete.
		return 0, nil
	}
	bundle := p.source.CurrentCABundleContent()
	if len(bundle) == 0 {
		// An empty caBundle would make the API server fall back to the
		// system roots; never write one.
		p.logs.Get(sourceKey).Info(p.logger, "waiting", "Waiting for the CA provider to have a bundle", "provider", p.source.Name())
		return 0, nil
	}
	p.logs.Get(sourceKey).Reset()

	var views []objectView
	indexer := t.informer.GetIndexer()
	if t.Name != "" {
		obj, exists, err := indexer.GetByKey(t.Name)
		if err != nil {
			return 0, fmt.Errorf("reading %s %q from the informer cache: %w", t.Kind, t.Name, err)
		}
		if !exists && t.adapter.create != nil {
			return 0, p.create(ctx, t, bundle)
		}
		if !exists {
			p.logs.Get(objectKey(t.Kind, t.Name)).Info(p.logger, "waiting: missing",
				"Waiting for the object to exist before publishing its caBundle", "kind", t.Kind, "name", t.Name)
			return 0, nil
		}
		if v, ok := t.adapter.view(obj); ok {
			views = append(views, v)
		}
	} else {
		for _, obj := range indexer.List() {
			if v, ok := t.adapter.view(obj); ok && t.selects(v.name, v.labels) {
				views = append(views, v)
			}
		}
		slices.SortFunc(views, func(a, b objectView) int { return strings.Compare(a.name, b.name) })
	}

	// Verify what is published now: the resync and a served chain's
	// change come through here, not through an object event.
	for _, v := range views {
		if t.selects(v.name, v.labels) {
			p.verify(t, v)
		}
	}

	var errs []error
	published := t.Name == "" // a selector target is done when nothing failed or is held back
	for _, v := range views {
		ok, later, err := p.publish(ctx, t, v, bundle)
		if err != nil {
			errs = append(errs, err)
		}
		if later > 0 && (after == 0 || later < after) {
			after = later
		}
		if t.Name != "" && ok {
			published = true
		}
		if t.Name == "" && !ok && later > 0 {
			published = false // a write held back by contested tracking or for a replica ahead
		}
	}
	if len(errs) > 0 {
		return after, errors.Join(errs...)
	}
	if published {
		p.ready.mark(p.logger, t)
	}
	return after, nil
}

// publish writes bundle into the object v when it differs. published is
// true when the object holds the bundle afterwards; after > 0 asks for the
// target to be looked at again after that long.
func (p *Publisher) publish(ctx context.Context, t *targetState, v objectView, bundle []byte) (published bool, after time.Duration, err error) {
	kind := t.Kind
	key := objectKey(kind, v.name)
	logger := p.logger.WithValues("kind", kind, "name", v.name)

	selected := p.selectedSlots(kind, v)
	if len(selected) == 0 {
		reason := v.none
		if reason == "" && t.Service != nil {
			reason = "no caBundle field of it refers to service " + t.Service.String()
		}
		if t.Name != "" {
			p.logs.Get(key).Info(p.logger, "waiting: "+reason,
				"Waiting for the object to have a caBundle field to publish to", "kind", kind, "name", v.name, "reason", reason)
		} else {
			// A selector can legitimately match objects of no concern.
			logger.V(4).Info("Skipping object with nothing to publish to", "reason", reason)
		}
		return false, 0, nil
	}
	if p.writes.cacheBehind(key, v.resourceVersion, bundle) {
		certmetrics.CABundlePublished(string(kind), resultUnchanged)
		return true, 0, nil
	}
	var stale [][]byte // what the selected fields that differ hold
	for _, s := range selected {
		if string(s.current) != string(bundle) {
			stale = append(stale, s.current)
		}
	}
	if len(stale) == 0 {
		p.contests.replicaCaughtUp(key)
		certmetrics.CABundlePublished(string(kind), resultUnchanged)
		p.recovered(key)
		p.verified.markPublished(key)
		// A contested object that holds the bundle is cleared once it has
		// held it long enough; until then, look again when it will have.
		return true, p.settle(t, v), nil
	}

	if p.byOwnReplica(stale, bundle) && !aheadOfAll(bundle, stale) {
		// Another replica of our Authority wrote its bundle, and ours is
		// no later step of the rotation: it writes its next one when its
		// source moves on (or a replica ahead does). Writing ours would
		// undo it, and it ours, for as long as their sources differ.
		// Looked at again after replicaGrace: a replica that is gone stops
		// announcing.
		p.contests.replicaCaughtUp(key)
		logger.V(2).Info("caBundle holds the bundle another live replica of our Authority announces, leaving it", "lookAgainIn", replicaGrace)
		certmetrics.CABundlePublished(string(kind), resultOwnReplica)
		return false, replicaGrace, nil
	}
	if !p.byReplicaAhead(v, stale, bundle) {
		p.contests.replicaCaughtUp(key)
	} else if wait := p.contests.waitForReplica(key); wait > 0 {
		// Writing ours would only undo the replica ahead until our source
		// catches up (its change queues the target again). Past the
		// grace, ours is written: a source stuck behind then goes through
		// contested tracking at the replicas ahead.
		logger.V(2).Info("caBundle holds a later step of this CA rotation from another replica, waiting for our source to catch up", "nextWriteIn", wait)
		certmetrics.CABundlePublished(string(kind), resultReplicaAhead)
		return false, wait, nil
	}
	g := p.contests.gate(key)
	if g.contested && g.wait > 0 {
		// Another writer keeps changing the field: hold the write back
		// until the backoff has passed, whatever events arrive meanwhile.
		certmetrics.CABundlePublished(string(kind), resultContested)
		logger.V(2).Info("caBundle is contested, holding the write back", "otherWriter", g.manager, "nextWriteIn", g.wait)
		return false, g.wait, nil
	}
	force := p.ssa && g.contested

	pt, data, err := p.buildWrite(t.adapter, v, selected, bundle)
	if err != nil {
		// Encoding plain maps and slices cannot fail; report it anyway.
		certmetrics.CABundlePublished(string(kind), resultError)
		return false, 0, fmt.Errorf("encoding caBundle %s for %s %q: %w", pt, kind, v.name, err)
	}
	opts := metav1.PatchOptions{FieldManager: p.fieldManager}
	if force {
		opts.Force = new(true)
		p.reportForced(t.adapter, v, g)
	}
	err = t.adapter.patch(ctx, v.name, pt, data, opts)
	if !force && isApplyConflict(err) && len(conflictManagers(err, p.fieldManager)) == 0 {
		// The only other owner is our own field manager, from an earlier
		// write with a JSON patch (an Update: a manager distinct from our
		// Apply). Taking the field from ourselves is no contest.
		logger.V(2).Info("caBundle owned by our own earlier update, applying with force", "err", err)
		force = true
		opts.Force = new(true)
		err = t.adapter.patch(ctx, v.name, pt, data, opts)
	}
	switch {
	case err == nil:
		p.writes.record(key, v.resourceVersion, bundle)
		p.verified.markPublished(key)
		certmetrics.CABundlePublished(string(kind), resultSuccess)
		p.recovered(key)
		logger.Info("Published caBundle", "fields", len(stale), "serverSideApply", p.ssa, "forced", force)
		if g.contested {
			// The write stands once it has held for the time returned.
			return true, p.contests.wrote(key), nil
		}
		return true, 0, nil
	case ctx.Err() != nil:
		// Shutting down; the failure says nothing about the target.
		return false, 0, ctx.Err()
	case apierrors.IsNotFound(err):
		// Deleted after it was cached. The informer's delete event queues
		// the target again, which then waits for the object.
		return false, 0, nil
	case isApplyConflict(err):
		// Server-side apply without force: another field manager owns a
		// caBundle field and holds another value. Never taken over
		// silently: contested, and forced only after the backoff.
		certmetrics.CABundlePublished(string(kind), resultContested)
		started, g := p.contests.conflict(key, strings.Join(conflictManagers(err, p.fieldManager), ", "))
		if started {
			p.reportContested(t.adapter, v, g)
		} else {
			logger.V(2).Info("Server-side apply conflict on a contested caBundle", "otherWriter", g.manager, "nextWriteIn", g.wait)
		}
		return false, g.wait, nil
	case apierrors.IsConflict(err):
		// Someone else wrote the object after the cache saw it, or the
		// cache is behind our own previous write. Expected, not an error:
		// the retry works on the newer version.
		certmetrics.CABundlePublished(string(kind), resultConflict)
		logger.V(2).Info("Conflict publishing caBundle, will retry", "err", err)
		return false, 0, fmt.Errorf("publishing caBundle to %s %q: %w", kind, v.name, err)
	default:
		certmetrics.CABundlePublished(string(kind), resultError)
		err = fmt.Errorf("publishing caBundle to %s %q: %w", kind, v.name, err)
		p.logs.Get(key).Error(p.logger, err, "Failed to publish caBundle, will retry with backoff", "object", key)
		return false, 0, err
	}
}

// create creates the missing object of the named target t holding bundle.
// Its watch event queues the target again, which then finds it up to date;
// readiness waits for that read-back. AlreadyExists (created by another
// replica after the cache looked) is a conflict, retried on a newer cache.
func (p *Publisher) create(ctx context.Context, t *targetState, bundle []byte) error {
	key := objectKey(t.Kind, t.Name)
	err := t.adapter.create(ctx, t.Target, bundle, p.fieldManager)
	switch {
	case err == nil:
		certmetrics.CABundlePublished(string(t.Kind), resultSuccess)
		p.recovered(key)
		p.verified.markPublished(key)
		p.logger.Info("Created object holding the bundle", "kind", t.Kind, "name", t.Name)
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case apierrors.IsAlreadyExists(err):
		certmetrics.CABundlePublished(string(t.Kind), resultConflict)
		p.logger.V(2).Info("Object created by someone else meanwhile, will retry", "kind", t.Kind, "name", t.Name)
		return fmt.Errorf("creating %s %q: %w", t.Kind, t.Name, err)
	default:
		certmetrics.CABundlePublished(string(t.Kind), resultError)
		err = fmt.Errorf("creating %s %q: %w", t.Kind, t.Name, err)
		p.logs.Get(key).Error(p.logger, err, "Failed to create the object holding the bundle, will retry with backoff", "object", key)
		return err
	}
}

// selectedSlots returns the slots of v that any target of kind selects. The
// union across targets matters for server-side apply: an apply releases the
// fields it omits, so two targets applying different subsets of one object
// under the same field manager would undo each other forever.
func (p *Publisher) selectedSlots(kind Kind, v objectView) []slot {
	var out []slot
	for _, s := range v.slots {
		for _, t := range p.targets {
			if t.Kind == kind && t.selects(v.name, v.labels) && t.wantsService(s.service) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// recovered records that the object key holds the bundle, and logs that
// publishing to it recovered if it last failed.
func (p *Publisher) recovered(key string) {
	p.logs.Get(key).Recovered(p.logger, "caBundle publishing recovered", "object", key)
}

// forget drops the log, write and contest bookkeeping of an object.
func (p *Publisher) forget(key string) {
	p.logs.Forget(key)
	p.writes.forget(key)
	p.contests.forget(key)
}
