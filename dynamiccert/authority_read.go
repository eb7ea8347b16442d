package dynamiccert

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// secretReads decides where an Authority's check reads its CA Secret from:
// the watch it runs anyway (secretSource.run, restricted to the one Secret
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
//   - the last request on the Secret failed, or a write conflicted or found
//     the Secret already created (the Conflict re-read);
//   - this replica wrote the Secret and the watch has not delivered that
//     write yet: deciding on the older content would take the Secret for
//     rolled back (secretStore.restore). A GET that shows what the cache
//     holds ends the wait too, so a write the watch skipped (a re-list)
//     does not leave the checks on GETs.
//
// Writes carry the resourceVersion of what was read, from either source, so
// a stale cache costs a Conflict and a GET, never a lost write. Safe for
// concurrent use: the watch calls observed, the checks (serialized by
// issuer.syncMu) the rest.
type secretReads struct {
	src *secretSource
	// apiFailing, when set, reports that other requests of this replica
	// fail (the Lease writer's).
	apiFailing func() bool

	mu sync.Mutex
	// mustGet: the next read is a GET (a failed request, a conflict).
	mustGet bool
	// awaiting: this replica wrote resourceVersion awaitRV and the watch
	// has not shown it yet ("" for a client that does not set them: then
	// any event ends the wait).
	awaiting bool
	awaitRV  string
}

// observed is called for every watch event (nil: the Secret was deleted).
func (r *secretReads) observed(secret *corev1.Secret) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.awaiting && (r.awaitRV == "" || secret != nil && secret.ResourceVersion == r.awaitRV) {
		r.awaiting = false
	}
}

// wrote records a successful write; failed a request that failed or
// conflicted.
func (r *secretReads) wrote(secret *corev1.Secret) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.awaiting, r.awaitRV, r.mustGet = true, secret.ResourceVersion, false
}

func (r *secretReads) failed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mustGet = true
}

// read returns the Secret as the API server has it, from the watch's cache
// when it is current, else with a GET; the error is the GET's (NotFound
// when the cache holds no such Secret). The Secret is the caller's.
func (r *secretReads) read(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	cached, inCache, ok := r.fromCache(namespace, name)
	if ok {
		if !inCache {
			return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
		}
		return cached.DeepCopy(), nil
	}
	secret, err := r.src.cfg.Client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		r.mustGet = false
		if r.awaiting && cached != nil && secret.ResourceVersion != "" && secret.ResourceVersion == cached.ResourceVersion {
			r.awaiting = false // the cache holds what the API server has
		}
	case apierrors.IsNotFound(err):
		r.mustGet = false
	default:
		r.mustGet = true
	}
	return secret, err
}

// fromCache returns the cached Secret (inCache: it exists) and whether the
// cache may be used; cached is set whenever the cache holds one.
func (r *secretReads) fromCache(namespace, name string) (cached *corev1.Secret, inCache, ok bool) {
	view := r.src.view.Load()
	if view == nil || !view.synced() {
		return nil, false, false
	}
	obj, inCache, err := view.store.GetByKey(namespace + "/" + name)
	if err != nil {
		return nil, false, false
	}
	if inCache {
		if cached, _ = obj.(*corev1.Secret); cached == nil {
			return nil, false, false
		}
	}
	r.mu.Lock()
	use := !r.mustGet && !r.src.watchFailing.Load() && (r.apiFailing == nil || !r.apiFailing())
	if use && r.awaiting {
		if inCache && r.awaitRV != "" && cached.ResourceVersion == r.awaitRV {
			r.awaiting = false
		} else {
			use = false
		}
	}
	r.mu.Unlock()
	return cached, inCache, use
}
