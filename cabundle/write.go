package cabundle

import (
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// jsonPatchOp is one RFC 6902 operation.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// buildWrite returns the request body that sets the selected slots of v to
// bundle: an apply object in server-side-apply mode, a JSON patch otherwise.
func (p *Publisher) buildWrite(a *kindAdapter, v objectView, selected []slot, bundle []byte) (types.PatchType, []byte, error) {
	if p.ssa {
		// Every selected slot is sent, not only the stale ones: an apply
		// releases (and, if nobody else owns them, removes) the fields it
		// omits.
		data, err := json.Marshal(a.applyBody(v.name, selected, bundle))
		return types.ApplyPatchType, data, err
	}
	data, err := json.Marshal(jsonPatch(v, selected, bundle, a.indexed || a.preconditioned, a.stringField))
	return types.JSONPatchType, data, err
}

// jsonPatch returns the operations that set the stale selected slots to
// bundle. "add" rather than "replace", because caBundle may be absent and
// "add" on an existing member replaces it.
//
// When the paths are indexed (webhooks: JSON patch has no other way into a
// list) they are only right for the version that was read, so the patch
// also sets metadata.resourceVersion to that version. The API server treats
// that as a precondition and answers 409 Conflict if the object changed in
// between. The fixed paths of CRDs and APIServices need no precondition, and
// one would only cause conflicts with the status updates their controllers
// make.
func jsonPatch(v objectView, selected []slot, bundle []byte, indexed, stringField bool) []jsonPatchOp {
	ops := make([]jsonPatchOp, 0, len(selected)+1)
	if indexed && v.resourceVersion != "" {
		ops = append(ops, jsonPatchOp{Op: "replace", Path: "/metadata/resourceVersion", Value: v.resourceVersion})
	}
	for _, s := range selected {
		if string(s.current) != string(bundle) {
			// A []byte marshals as base64, as the API expects for caBundle;
			// a string field takes the PEM as is.
			var value any = bundle
			if stringField {
				value = string(bundle)
			}
			ops = append(ops, jsonPatchOp{Op: "add", Path: s.path, Value: value})
		}
	}
	return ops
}

// isApplyConflict reports whether err is a server-side apply conflict with
// another field manager (rather than an optimistic-concurrency conflict).
func isApplyConflict(err error) bool {
	if !apierrors.IsConflict(err) {
		return false
	}
	for _, c := range statusCauses(err) {
		if c.Type == metav1.CauseTypeFieldManagerConflict {
			return true
		}
	}
	return false
}

// conflictManagerRE matches the manager in a conflict cause message, e.g.
// `conflict with "helm" using admissionregistration.k8s.io/v1`.
var conflictManagerRE = regexp.MustCompile(`^conflict with ("(?:[^"\\]|\\.)*")`)

// conflictManagers returns the field managers, other than ours, that an
// apply conflict names, sorted and without duplicates. A conflict whose
// managers cannot be read names "unknown".
func conflictManagers(err error, ours string) []string {
	var out []string
	for _, c := range statusCauses(err) {
		if c.Type != metav1.CauseTypeFieldManagerConflict {
			continue
		}
		name := "unknown"
		if m := conflictManagerRE.FindStringSubmatch(c.Message); m != nil {
			if s, err := strconv.Unquote(m[1]); err == nil {
				name = s
			}
		}
		if name != ours {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func statusCauses(err error) []metav1.StatusCause {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return nil
	}
	return status.Status().Details.Causes
}

// writes remembers, by object key, the last successful write of each
// object, so that a cache which has not yet seen it is not mistaken for
// drift: without it, every event that arrives between the write and its
// watch event would write again (and, with the resourceVersion
// precondition, fail with a spurious conflict). The zero value is ready to
// use, and writes is safe for concurrent use.
type writes struct {
	mu   sync.Mutex
	last map[string]writeRecord
}

// writeRecord is one successful write.
type writeRecord struct {
	// fromRV is the resourceVersion the write was based on.
	fromRV string
	bundle string
}

// record remembers that the object key, at resourceVersion fromRV, was
// successfully written with bundle.
func (w *writes) record(key, fromRV string, bundle []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = make(map[string]writeRecord)
	}
	w.last[key] = writeRecord{fromRV: fromRV, bundle: string(bundle)}
}

// cacheBehind reports whether the cached object at rv is the very version
// our last write of bundle was based on: then the server already has the
// bundle and the write's watch event is on its way. Any other version
// (someone else's write, or our write arriving) ends that state. Objects
// without a resourceVersion (fake clients) are never treated so.
func (w *writes) cacheBehind(key, rv string, bundle []byte) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.last[key]
	if !ok || rv == "" {
		return false
	}
	if r.fromRV == rv && r.bundle == string(bundle) {
		return true
	}
	delete(w.last, key)
	return false
}

// forget drops what is remembered of key.
func (w *writes) forget(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, key)
}
