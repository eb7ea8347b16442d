package authority

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/evercert/evercert/internal/secretwatch"
)

// secretReads decides where an Authority's check reads its CA Secret from:
// the watch it runs anyway (secretwatch.Source.Run, restricted to the one Secret
// by a field selector), or a GET. At rest a check costs the API server
// nothing (issue 22: nothing is polled that a watch already delivers); a
// GET is sent only when the cache cannot be trusted to be current:
//
//   - the watch has not synced yet, or is not running (RunOnce);
//   - the watch reported an error and no event arrived since: it backs
//     off or re-lists, and what it holds may be old. During an API outage
//     the checks therefore keep failing and retrying with the issuer's
//     backoff, and the first that succeeds is how this replica learns the
//     API server answers again (issuer.run wakes the Lease writer);
//   - this replica's Lease writes fail (apiFailing): the same reasoning for
//     an outage the watches do not notice;
//   - a write failed, conflicted or found the Secret already created (the
//     Conflict re-read), and no GET succeeded since (after a write that
//     failed for another reason, a watch delivery since ends it too; not
//     after a refusal, as a lagging watch may deliver a version older than
//     the one refused). A failed GET does not add to
//     this: with get forbidden by RBAC while list and watch are allowed, a
//     GET before the watch synced would otherwise keep every later check on
//     GETs that fail, and the same deployment would work or not depending
//     on which came first;
//   - this replica wrote the Secret and the watch has not delivered that
//     write yet: deciding on the older content would take the Secret for
//     rolled back (secretStore.restore). A GET that shows what the cache
//     holds ends the wait too, so a write the watch skipped (a re-list)
//     does not leave the checks on GETs;
//   - the watch has not shown its cache current for maxAge: no event, no
//     bookmark, no list, and no GET that found what the cache holds. A
//     watch can stay open and deliver nothing (a wedged watch cache, a
//     proxy); trusting it then would leave the replica blind, e.g. signing
//     with a CA an operator marked compromised. A healthy kube-apiserver
//     watch sends a bookmark about every minute (the reflector asks for
//     them), so at rest this costs nothing there; a server that sends none
//     (the fake clientset) costs a GET per maxAge.
//
// A GET that fails when nothing was read fresh for maxAge (the watch's
// delivery, a GET) is an unconfirmedReadError: the check fails, and
// LastError says "stale watch" (counted once per episode) until a read
// succeeds or the watch delivers again. It does not fail readiness: the
// same GET fails on every replica alike (see RotationStatus.Stalled).
//
// Writes carry the resourceVersion of what was read, from either source, so
// a stale cache costs a Conflict and a GET, never a lost write. Safe for
// concurrent use: the watch calls observed, the checks (serialized by
// issuer.syncMu) the rest.
type secretReads struct {
	src *secretwatch.Source
	// apiFailing, when set, reports that other requests of this replica
	// fail (the Lease writer's).
	apiFailing func() bool
	// maxAge bounds how long ago, on src.Config.Clock, the cache may have
	// been shown current for a check to use it (see secretReadsMaxAge).
	maxAge time.Duration

	mu sync.Mutex
	// mustGet: the next read is a GET (a failed write, a conflict),
	// until a GET succeeds or the watch delivers after the failure
	// (src.Deliveries beyond failedAt); after a refused write (staleRV),
	// only until a GET succeeds.
	mustGet  bool
	failedAt uint64
	// staleRV is the resourceVersion a write was refused for (Conflict;
	// absentRV: a create refused with AlreadyExists): a cache that still
	// holds it is older than the API server's.
	staleRV string
	// awaiting: this replica wrote resourceVersion awaitRV, or a GET read
	// it, and the watch has not shown it yet ("" for a client that does
	// not set them: then any event ends the wait; absentRV: a GET found
	// no Secret while the cache held one, and the watch has not shown the
	// deletion yet).
	awaiting bool
	awaitRV  string
	// got, when a GET set awaiting (gotSet), is what it read (nil: no
	// Secret): newer than the cache, so reads return it, without a GET
	// each (TestAPIBudgetPerRotation), while the cache still holds what it
	// held then (gotOver, absentRV for nothing). A cache that moved on
	// to another version (a relist past the one awaited) is not ordered
	// against it: then reads GET.
	got     *corev1.Secret
	gotSet  bool
	gotOver string
	// events counts observed calls. gotAt is the events and the watch's
	// Deliveries counted before the read that set got looked at the cache:
	// got is returned only while neither moved. A version of the cache
	// can recur (no Secret: a peer's create and delete, during the GET or
	// skipped by a relist), so gotOver alone does not show that the cache
	// did not move.
	events uint64
	gotAt  [2]uint64
	// confirmed is when a GET last found what the cache holds.
	confirmed time.Time
	// fresh is when a GET last answered (the Secret, or NotFound), or the
	// first read: the start of the maxAge after which a failed GET leaves
	// the replica unconfirmed.
	fresh time.Time
}

// absentRV stands for "no Secret" in secretReads.staleRV: a create that
// found the Secret already there was decided on a cache without it.
const absentRV = "(absent)"

// minSecretCacheAge is the shortest maxAge: twice the kube-apiserver's
// bookmark frequency (one minute, its watch cache's), so that a healthy
// watch keeps the cache in use at rest even when a bookmark is a little
// late.
const minSecretCacheAge = 2 * time.Minute

// secretReadsMaxAge is the longest an Authority trusts its watch's cache
// without seeing the watch deliver (an event or a bookmark) or a GET
// confirm it: its check interval, and at least minSecretCacheAge. A change
// of the Secret (an operator's compromised-ca mark) is therefore acted on
// within maxAge plus a check interval even when the watch delivers nothing.
func secretReadsMaxAge(checkInterval time.Duration) time.Duration {
	return max(checkInterval, minSecretCacheAge)
}

func newSecretReads(src *secretwatch.Source, checkInterval time.Duration) *secretReads {
	return &secretReads{src: src, maxAge: secretReadsMaxAge(checkInterval)}
}

// unconfirmedReadError is a failed GET of the CA Secret when neither the
// watch nor a GET showed the Secret as the API server has it for maxAge:
// the replica cannot see a change of the Secret (a compromised-ca mark, a
// successor) until a read succeeds. Its message is the same for every
// attempt of one episode, so it is counted and logged once.
type unconfirmedReadError struct {
	err    error
	maxAge time.Duration
}

func (e *unconfirmedReadError) Error() string {
	return fmt.Sprintf("stale watch: no event or bookmark from the Secret's watch and no successful read for %v, and the GET failed: %v", e.maxAge, e.err)
}

func (e *unconfirmedReadError) Unwrap() error { return e.err }

// observed is called for every watch event (nil: the Secret was deleted).
func (r *secretReads) observed(secret *corev1.Secret) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.awaiting && (r.awaitRV == "" || secret != nil && secret.ResourceVersion == r.awaitRV || secret == nil && r.awaitRV == absentRV) {
		r.awaiting, r.got, r.gotSet = false, nil, false
	}
	r.events++
}

// wrote records a successful write; failed a write that failed or
// conflicted: reads GET until a GET succeeds or the watch delivers anew.
// staleRV is the resourceVersion a refused write was based on (absentRV for
// a create; "" when the write failed for another reason).
func (r *secretReads) wrote(secret *corev1.Secret) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.awaiting, r.awaitRV, r.mustGet, r.staleRV = true, secret.ResourceVersion, false, ""
	r.got, r.gotSet = nil, false
}

func (r *secretReads) failed(staleRV string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mustGet, r.failedAt = true, r.src.Deliveries()
	if staleRV != "" {
		r.staleRV = staleRV
	}
}

// read returns the Secret as the API server has it, from the watch's cache
// when it is current, else with a GET; the error is the GET's (NotFound
// when the cache holds no such Secret). The Secret is read-only: one from
// the cache is the cache's, not copied at every check (updateOnce parses
// it and changes only a copy, the one it writes).
func (r *secretReads) read(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	now := r.src.Config.Clock.Now()
	r.mu.Lock()
	if r.fresh.IsZero() {
		r.fresh = now // the bound starts with the first read
	}
	r.mu.Unlock()
	cached, inCache, synced, seen, ok := r.fromCache(namespace, name, now)
	if ok {
		if !inCache {
			return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
		}
		return cached, nil
	}
	secret, err := r.src.Config.Client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		r.mustGet, r.staleRV, r.fresh = false, "", now
		switch {
		case secret.ResourceVersion == "":
		case cached != nil && secret.ResourceVersion == cached.ResourceVersion:
			// The cache holds what the API server has.
			r.awaiting, r.got, r.gotSet, r.confirmed = false, nil, false, now
		default:
			// The API server is ahead of the cache: the cache is used
			// again once it shows this version (or a GET finds it
			// current). Deciding on the older version next would undo
			// what this check saw: a replica that had seen a peer's
			// successor took the lagging cache for a rollback and wrote
			// its CAs back (TestAdoptCertControllerSecret, 1 run in 200).
			r.awaiting, r.awaitRV, r.got, r.gotSet, r.gotOver, r.gotAt = true, secret.ResourceVersion, secret, true, rvOrAbsent(cached), seen
		}
	case apierrors.IsNotFound(err):
		r.mustGet, r.staleRV, r.fresh = false, "", now
		switch {
		case synced && !inCache:
			// The cache holds what the API server has: no Secret. A
			// version awaited (written, or read by a GET) was deleted
			// since, and will never show.
			r.confirmed, r.awaiting, r.got, r.gotSet = now, false, nil, false
		case synced:
			// The API server is ahead of the cache: the Secret it holds
			// was deleted. Deciding on it next would undo what this
			// check saw, as for a GET that reads a newer version.
			r.awaiting, r.awaitRV, r.got, r.gotSet, r.gotOver, r.gotAt = true, absentRV, nil, true, rvOrAbsent(cached), seen
		}
	default:
		// A GET that fails changes nothing the cache depends on: the reason
		// this read was a GET decides the next one. Keeping later reads on
		// GETs until one succeeds would, with get forbidden and list and
		// watch allowed, never use the watch again (issue 27 §4).
		if last := latest(r.fresh, r.src.DeliveredAt()); now.Sub(last) >= r.maxAge && ctx.Err() == nil {
			err = &unconfirmedReadError{err: err, maxAge: r.maxAge}
		}
	}
	return secret, err
}

// rvOrAbsent is s's resourceVersion, absentRV for no Secret.
func rvOrAbsent(s *corev1.Secret) string {
	if s == nil {
		return absentRV
	}
	return s.ResourceVersion
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fromCache returns the cached Secret (inCache: it exists), whether the
// cache has synced, and whether the cache may be used at now; cached is
// set whenever the cache holds one.
func (r *secretReads) fromCache(namespace, name string, now time.Time) (cached *corev1.Secret, inCache, synced bool, seen [2]uint64, ok bool) {
	// Counted before the cache is read: a change of the cache this read
	// does not see is counted after.
	r.mu.Lock()
	seen = [2]uint64{r.events, r.src.Deliveries()}
	r.mu.Unlock()
	view := r.src.Cache.Load()
	if view == nil || !view.Synced() {
		return nil, false, false, seen, false
	}
	obj, inCache, err := view.Store.GetByKey(namespace + "/" + name)
	if err != nil {
		return nil, false, false, seen, false
	}
	if inCache {
		if cached, _ = obj.(*corev1.Secret); cached == nil {
			return nil, false, false, seen, false
		}
	}
	r.mu.Lock()
	// A write that failed for another reason is over once the watch
	// delivers after it. A refused one (staleRV set) only with a GET that
	// succeeds: a watch that lags can deliver a version older than the
	// one refused, and deciding on it would undo what this replica
	// already saw (a compromised-ca mark, a successor).
	if r.mustGet && r.staleRV == "" && r.src.Deliveries() > r.failedAt {
		// The watch delivered since the failure, and not the version a
		// write was refused for.
		r.mustGet, r.staleRV = false, ""
	}
	// The watch (or a GET) showed the cache current within maxAge: an open
	// watch that delivers nothing must not be trusted for longer.
	current := now.Sub(latest(r.confirmed, r.src.DeliveredAt())) < r.maxAge
	use := current && !r.mustGet && !r.src.WatchFailing.Load() && (r.apiFailing == nil || !r.apiFailing())
	if use && r.awaiting {
		switch {
		case inCache && r.awaitRV != "" && cached.ResourceVersion == r.awaitRV || !inCache && r.awaitRV == absentRV:
			r.awaiting, r.got, r.gotSet = false, nil, false
		case r.gotSet && rvOrAbsent(cached) == r.gotOver && r.gotAt == [2]uint64{r.events, r.src.Deliveries()}:
			// A GET read a version the cache does not show yet, and the
			// cache has not moved since: that is the newest this replica
			// knows, and costs no request.
			cached, inCache = r.got, r.got != nil
		default:
			use = false
		}
	}
	r.mu.Unlock()
	return cached, inCache, true, seen, use
}
