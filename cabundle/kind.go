package cabundle

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// This file holds what every kind has in common: the registry of kinds, the
// kindAdapter through which the publisher's logic is written once for all
// of them, and the generic pieces that turn a kind's Go type into an
// adapter. Each kind lives in a file of its own (kind_*.go) that registers
// it; adding a kind is adding such a file.

// Kind is the kind of object a [Target] writes into. Its value is the
// Kubernetes kind name, and is also the "kind" label of
// evercert_cabundle_publish_total. The kinds are the constants of type Kind
// in this package.
type Kind string

// kindBuilder builds the adapter of one kind, taking the client it needs
// from clients.
type kindBuilder func(c *clients) (*kindAdapter, error)

// kinds is the registry of the kinds a Publisher can write into, filled by
// the init functions of the kind_*.go files and read-only afterwards.
var kinds = map[Kind]kindBuilder{}

// registerKind adds kind to the registry; it panics on a kind registered
// twice, a programming error.
func registerKind(kind Kind, build kindBuilder) {
	if _, dup := kinds[kind]; dup {
		panic(fmt.Sprintf("cabundle: kind %s registered twice", kind))
	}
	kinds[kind] = build
}

// registeredKinds lists the registered kinds, sorted, for error messages.
func registeredKinds() []Kind {
	out := make([]Kind, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// slot is one caBundle field of an object.
type slot struct {
	// path is the field's JSON pointer, used by the JSON patch.
	path string
	// webhook is the name of the webhook holding the field (webhook
	// configurations only); it is the list-map key server-side apply needs.
	webhook string
	// current is the field's value now.
	current []byte
	// service is the Service the field's client configuration refers to,
	// nil when it refers to a URL (or, for APIServices, never: local
	// APIServices have no slot at all).
	service *ServiceRef
}

// objectView is what the publisher needs to know about one cached object.
type objectView struct {
	name            string
	uid             types.UID
	resourceVersion string
	labels          map[string]string
	// owners are the field managers that own a caBundle field of the
	// object (any of them, selected or not), to name another writer.
	owners []fieldOwner
	// slots lists the caBundle fields that may be written, in object order.
	slots []slot
	// none says why slots is empty, for the "waiting" log line.
	none string
}

// fieldOwner is a managedFields entry that owns a caBundle field.
type fieldOwner struct {
	manager   string
	operation metav1.ManagedFieldsOperationType
	time      time.Time
}

// ownsCABundle reports whether the managedFields entry e owns a caBundle
// field: caBundle, or a ClusterTrustBundle's spec.trustBundle (no other
// kind has a field of that name). Without trustBundle a ClusterTrustBundle
// had no owner at all: no other writer was named, and no change by another
// replica of the publisher was recognized as one. An entry without
// fieldsV1 counts: the informer transforms keep exactly those entries, and
// drop their (possibly large) fieldsV1.
func ownsCABundle(e metav1.ManagedFieldsEntry) bool {
	if e.FieldsV1 == nil {
		return true
	}
	raw := e.FieldsV1.GetRawBytes()
	return bytes.Contains(raw, []byte(`"f:caBundle"`)) || bytes.Contains(raw, []byte(`"f:trustBundle"`))
}

// caBundleOwners returns the managers among mf that own a caBundle field.
func caBundleOwners(mf []metav1.ManagedFieldsEntry) []fieldOwner {
	var out []fieldOwner
	for _, e := range mf {
		if !ownsCABundle(e) {
			continue
		}
		o := fieldOwner{manager: e.Manager, operation: e.Operation}
		if e.Time != nil {
			o.time = e.Time.Time
		}
		out = append(out, o)
	}
	return out
}

// trimManagedFields keeps, of mf, the entries that own a caBundle field,
// without their fieldsV1; nil when there are none.
func trimManagedFields(mf []metav1.ManagedFieldsEntry) []metav1.ManagedFieldsEntry {
	var out []metav1.ManagedFieldsEntry
	for _, e := range mf {
		if e.FieldsV1 == nil || !ownsCABundle(e) {
			continue
		}
		e.FieldsV1 = nil
		out = append(out, e)
	}
	return out
}

// newView starts the objectView of an object from its metadata.
func newView(o metav1.Object) objectView {
	return objectView{
		name:            o.GetName(),
		uid:             o.GetUID(),
		resourceVersion: o.GetResourceVersion(),
		labels:          o.GetLabels(),
		owners:          caBundleOwners(o.GetManagedFields()),
	}
}

// kindAdapter holds everything kind specific; the publisher's logic is
// written once against it.
type kindAdapter struct {
	kind       Kind
	apiVersion string
	// newInformer returns an informer restricted by tweak.
	newInformer func(tweak func(*metav1.ListOptions)) cache.SharedIndexInformer
	// view extracts the objectView of an object of this kind; ok is false
	// for anything else (a tombstone, a foreign type).
	view func(obj any) (v objectView, ok bool)
	// patch sends a PATCH request for the named object.
	patch patchFunc
	// applyBody returns the server-side-apply object for the named object
	// that sets the given slots to bundle, and nothing else.
	applyBody func(name string, slots []slot, bundle []byte) map[string]any
	// transform trims cached objects to what the publisher reads.
	transform cache.TransformFunc
	// indexed says that slot paths contain list indexes, which are only
	// valid on the version that was read; see jsonPatch.
	indexed bool
	// preconditioned says that the JSON patch carries the resourceVersion
	// read even though the paths are fixed: every replica of a signer
	// writes the same object, and a blind write could put one replica's
	// older bundle back over another's newer one.
	preconditioned bool
	// stringField says that the field is a string (PEM as is) rather than
	// bytes (base64 in JSON, like every caBundle).
	stringField bool
	// create, when set, creates the object of a named target that is
	// missing, holding bundle: the kind's objects belong to the publisher.
	// When nil, a missing object is waited for.
	create func(ctx context.Context, t Target, bundle []byte, fieldManager string) error
}

// patchFunc sends a PATCH request for the named object.
type patchFunc func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error

// objectPtr is the constraint of the generic helpers below: PO is a
// pointer to the Go type O of a Kubernetes object.
type objectPtr[O any] interface {
	*O
	metav1.Object
}

// patcher is the Patch method of a typed client for objects of type PO.
type patcher[PO any] interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (PO, error)
}

// patchVia returns the patchFunc of a typed client.
func patchVia[PO any](client patcher[PO]) patchFunc {
	return func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error {
		_, err := client.Patch(ctx, name, pt, data, opts)
		return err
	}
}

// informerOf returns the kindAdapter.newInformer of a generated filtered
// informer constructor (NewFilteredXxxInformer) and its client. The
// informer has no resync of its own: the publisher's resync ticker queues
// every target.
func informerOf[C any, T ~func(*metav1.ListOptions)](newFiltered func(C, time.Duration, cache.Indexers, T) cache.SharedIndexInformer, client C) func(tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return func(tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
		return newFiltered(client, 0, cache.Indexers{}, tweak)
	}
}

// viewOf returns the kindAdapter.view of a kind from the view of its Go
// type.
func viewOf[O any, PO objectPtr[O]](view func(PO) objectView) func(any) (objectView, bool) {
	return func(obj any) (objectView, bool) {
		o, ok := obj.(PO)
		if !ok {
			return objectView{}, false
		}
		return view(o), true
	}
}

// trimmed is the informer transform that drops what the publisher never
// reads before an object is cached: managedFields, often the largest part
// of these objects, except who owns a caBundle field (to name another
// writer). It works on a shallow copy rather than in place: a real client
// decodes a fresh object for every event, but a fake one hands out the
// very object it stores, and writing to that would be a data race; the
// copy costs one struct per event. Anything that is not a PO (a tombstone)
// is passed through.
func trimmed[O any, PO objectPtr[O]](obj any) (any, error) {
	o, ok := obj.(PO)
	if !ok {
		return obj, nil
	}
	c := PO(new(O))
	*c = *o
	c.SetManagedFields(trimManagedFields(o.GetManagedFields()))
	return c, nil
}

// applyHeader returns the apiVersion/kind/metadata part of an apply object.
func applyHeader(apiVersion string, kind Kind, name string) map[string]any {
	return map[string]any{
		"apiVersion": apiVersion,
		"kind":       string(kind),
		"metadata":   map[string]any{"name": name},
	}
}

// listOptionsFor restricts a target's informer on the server: to the one
// object for a named target (so its cache holds a single object, and RBAC
// can restrict list and watch to that name), to matching labels otherwise.
func listOptionsFor(t Target) func(*metav1.ListOptions) {
	if t.Name != "" {
		sel := fields.OneTermEqualSelector("metadata.name", t.Name).String()
		return func(o *metav1.ListOptions) { o.FieldSelector = sel }
	}
	sel := t.Selector.String()
	return func(o *metav1.ListOptions) { o.LabelSelector = sel }
}

// withClient returns the kindBuilder of a kind whose adapter needs the
// client that get returns.
func withClient[C any](get func(*clients) (C, error), build func(C) *kindAdapter) kindBuilder {
	return func(c *clients) (*kindAdapter, error) {
		client, err := get(c)
		if err != nil {
			return nil, err
		}
		return build(client), nil
	}
}
