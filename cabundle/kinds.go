package cabundle

import (
	"bytes"
	"context"
	"fmt"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apiextensionsinformers "k8s.io/apiextensions-apiserver/pkg/client/informers/externalversions/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	admissionregistrationinformers "k8s.io/client-go/informers/admissionregistration/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	apiregistrationinformers "k8s.io/kube-aggregator/pkg/client/informers/externalversions/apiregistration/v1"
)

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

// caBundleOwners returns the managers among mf that own a caBundle field.
// An entry without fieldsV1 counts: the informer transforms keep exactly
// those entries, and drop their (possibly large) fieldsV1.
func caBundleOwners(mf []metav1.ManagedFieldsEntry) []fieldOwner {
	var out []fieldOwner
	for _, e := range mf {
		if e.FieldsV1 != nil && !bytes.Contains(e.FieldsV1.GetRawBytes(), []byte(`"f:caBundle"`)) {
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
		if e.FieldsV1 == nil || !bytes.Contains(e.FieldsV1.GetRawBytes(), []byte(`"f:caBundle"`)) {
			continue
		}
		e.FieldsV1 = nil
		out = append(out, e)
	}
	return out
}

// newView starts the objectView of an object from its metadata.
func newView(m *metav1.ObjectMeta) objectView {
	return objectView{
		name:            m.Name,
		uid:             m.UID,
		resourceVersion: m.ResourceVersion,
		labels:          m.Labels,
		owners:          caBundleOwners(m.ManagedFields),
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
	patch func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error
	// applyBody returns the server-side-apply object for the named object
	// that sets the given slots to bundle, and nothing else.
	applyBody func(name string, slots []slot, bundle []byte) map[string]any
	// transform trims cached objects to what the publisher reads.
	transform cache.TransformFunc
	// indexed says that slot paths contain list indexes, which are only
	// valid on the version that was read; see jsonPatch.
	indexed bool
}

// serviceRef converts the service reference of a webhook client config.
func serviceRef(namespace, name string) *ServiceRef {
	return &ServiceRef{Namespace: namespace, Name: name}
}

// The informer transforms below drop what the publisher never reads before
// an object is cached: managedFields, often the largest part of these
// objects, except who owns a caBundle field (to name another writer), and,
// for CRDs, more. They work on a shallow copy rather than in
// place: a real client decodes a fresh object for every event, but a fake
// one hands out the very object it stores, and writing to that would be a
// data race; the copy costs one struct per event.

func trimValidatingWebhookConfiguration(obj any) (any, error) {
	if o, ok := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok {
		c := *o
		c.ManagedFields = trimManagedFields(o.ManagedFields)
		return &c, nil
	}
	return obj, nil
}

func trimMutatingWebhookConfiguration(obj any) (any, error) {
	if o, ok := obj.(*admissionregistrationv1.MutatingWebhookConfiguration); ok {
		c := *o
		c.ManagedFields = trimManagedFields(o.ManagedFields)
		return &c, nil
	}
	return obj, nil
}

func trimAPIService(obj any) (any, error) {
	if o, ok := obj.(*apiregistrationv1.APIService); ok {
		c := *o
		c.ManagedFields = trimManagedFields(o.ManagedFields)
		return &c, nil
	}
	return obj, nil
}

// applyHeader returns the apiVersion/kind/metadata part of an apply object.
func applyHeader(apiVersion string, kind Kind, name string) map[string]any {
	return map[string]any{
		"apiVersion": apiVersion,
		"kind":       string(kind),
		"metadata":   map[string]any{"name": name},
	}
}

// webhookApplyBody is the apply object for both webhook configuration
// kinds: each selected webhook's name (the list-map key, without which the
// entry cannot be addressed) and its clientConfig.caBundle.
func webhookApplyBody(apiVersion string, kind Kind) func(string, []slot, []byte) map[string]any {
	return func(name string, slots []slot, bundle []byte) map[string]any {
		body := applyHeader(apiVersion, kind, name)
		webhooks := make([]any, 0, len(slots))
		for _, s := range slots {
			webhooks = append(webhooks, map[string]any{
				"name":         s.webhook,
				"clientConfig": map[string]any{"caBundle": bundle},
			})
		}
		body["webhooks"] = webhooks
		return body
	}
}

func webhookSlot(i int, name string, cc admissionregistrationv1.WebhookClientConfig) slot {
	s := slot{
		path:    fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i),
		webhook: name,
		current: cc.CABundle,
	}
	if cc.Service != nil {
		s.service = serviceRef(cc.Service.Namespace, cc.Service.Name)
	}
	return s
}

func noWebhooks(v *objectView) {
	if len(v.slots) == 0 {
		v.none = "it has no webhooks"
	}
}

func validatingWebhookAdapter(client kubernetes.Interface) *kindAdapter {
	const apiVersion = "admissionregistration.k8s.io/v1"
	return &kindAdapter{
		kind:       ValidatingWebhookConfiguration,
		apiVersion: apiVersion,
		newInformer: func(tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
			return admissionregistrationinformers.NewFilteredValidatingWebhookConfigurationInformer(client, 0, cache.Indexers{}, tweak)
		},
		view: func(obj any) (objectView, bool) {
			o, ok := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
			if !ok {
				return objectView{}, false
			}
			v := newView(&o.ObjectMeta)
			for i, wh := range o.Webhooks {
				v.slots = append(v.slots, webhookSlot(i, wh.Name, wh.ClientConfig))
			}
			noWebhooks(&v)
			return v, true
		},
		patch: func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error {
			_, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(ctx, name, pt, data, opts)
			return err
		},
		applyBody: webhookApplyBody(apiVersion, ValidatingWebhookConfiguration),
		transform: trimValidatingWebhookConfiguration,
		indexed:   true,
	}
}

func mutatingWebhookAdapter(client kubernetes.Interface) *kindAdapter {
	const apiVersion = "admissionregistration.k8s.io/v1"
	return &kindAdapter{
		kind:       MutatingWebhookConfiguration,
		apiVersion: apiVersion,
		newInformer: func(tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
			return admissionregistrationinformers.NewFilteredMutatingWebhookConfigurationInformer(client, 0, cache.Indexers{}, tweak)
		},
		view: func(obj any) (objectView, bool) {
			o, ok := obj.(*admissionregistrationv1.MutatingWebhookConfiguration)
			if !ok {
				return objectView{}, false
			}
			v := newView(&o.ObjectMeta)
			for i, wh := range o.Webhooks {
				v.slots = append(v.slots, webhookSlot(i, wh.Name, wh.ClientConfig))
			}
			noWebhooks(&v)
			return v, true
		},
		patch: func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error {
			_, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, name, pt, data, opts)
			return err
		},
		applyBody: webhookApplyBody(apiVersion, MutatingWebhookConfiguration),
		transform: trimMutatingWebhookConfiguration,
		indexed:   true,
	}
}

// crdView extracts the conversion webhook slot of a CRD.
func crdView(o *apiextensionsv1.CustomResourceDefinition) objectView {
	v := newView(&o.ObjectMeta)
	conv := o.Spec.Conversion
	switch {
	case conv == nil || conv.Strategy != apiextensionsv1.WebhookConverter:
		// With strategy None the API server forbids spec.conversion.webhook
		// altogether, so there is nothing that could be written.
		v.none = "its conversion strategy is not Webhook"
	case conv.Webhook == nil || conv.Webhook.ClientConfig == nil:
		v.none = "its conversion webhook has no clientConfig"
	default:
		cc := conv.Webhook.ClientConfig
		s := slot{path: "/spec/conversion/webhook/clientConfig/caBundle", current: cc.CABundle}
		if cc.Service != nil {
			s.service = serviceRef(cc.Service.Namespace, cc.Service.Name)
		}
		v.slots = []slot{s}
	}
	return v
}

// trimCRD also drops the versions (with their OpenAPI schemas, easily
// hundreds of kilobytes per CRD) and the status: the JSON patch addresses
// the conversion webhook by a fixed path and the apply object is built from
// scratch, so a trimmed cached copy is as good as the full one.
func trimCRD(obj any) (any, error) {
	if o, ok := obj.(*apiextensionsv1.CustomResourceDefinition); ok {
		c := *o
		c.ManagedFields = trimManagedFields(o.ManagedFields)
		c.Spec.Versions = nil
		c.Status = apiextensionsv1.CustomResourceDefinitionStatus{}
		return &c, nil
	}
	return obj, nil
}

func crdAdapter(client apiextensionsclient.Interface) *kindAdapter {
	const apiVersion = "apiextensions.k8s.io/v1"
	return &kindAdapter{
		kind:       CustomResourceDefinition,
		apiVersion: apiVersion,
		newInformer: func(tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
			return apiextensionsinformers.NewFilteredCustomResourceDefinitionInformer(client, 0, cache.Indexers{}, tweak)
		},
		view: func(obj any) (objectView, bool) {
			o, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
			if !ok {
				return objectView{}, false
			}
			return crdView(o), true
		},
		patch: func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error {
			_, err := client.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, name, pt, data, opts)
			return err
		},
		applyBody: func(name string, _ []slot, bundle []byte) map[string]any {
			body := applyHeader(apiVersion, CustomResourceDefinition, name)
			// strategy is deliberately absent: it belongs to whoever
			// installed the CRD, and the merged object keeps theirs.
			body["spec"] = map[string]any{"conversion": map[string]any{"webhook": map[string]any{
				"clientConfig": map[string]any{"caBundle": bundle},
			}}}
			return body
		},
		transform: trimCRD,
	}
}

// apiServiceView extracts the spec.caBundle slot of an APIService.
func apiServiceView(o *apiregistrationv1.APIService) objectView {
	v := newView(&o.ObjectMeta)
	switch {
	case o.Spec.Service == nil:
		// Local APIServices are served by the kube-apiserver itself, and
		// validation rejects a caBundle on them.
		v.none = "it is a local APIService (no spec.service)"
	case o.Spec.InsecureSkipTLSVerify:
		// Validation rejects caBundle together with insecureSkipTLSVerify;
		// flipping the latter is the owner's decision, not ours.
		v.none = "it sets insecureSkipTLSVerify, which the API server does not allow together with a caBundle"
	default:
		v.slots = []slot{{
			path:    "/spec/caBundle",
			current: o.Spec.CABundle,
			service: serviceRef(o.Spec.Service.Namespace, o.Spec.Service.Name),
		}}
	}
	return v
}

func apiServiceAdapter(client aggregatorclient.Interface) *kindAdapter {
	const apiVersion = "apiregistration.k8s.io/v1"
	return &kindAdapter{
		kind:       APIService,
		apiVersion: apiVersion,
		newInformer: func(tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
			return apiregistrationinformers.NewFilteredAPIServiceInformer(client, 0, cache.Indexers{}, tweak)
		},
		view: func(obj any) (objectView, bool) {
			o, ok := obj.(*apiregistrationv1.APIService)
			if !ok {
				return objectView{}, false
			}
			return apiServiceView(o), true
		},
		patch: func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error {
			_, err := client.ApiregistrationV1().APIServices().Patch(ctx, name, pt, data, opts)
			return err
		},
		applyBody: func(name string, _ []slot, bundle []byte) map[string]any {
			body := applyHeader(apiVersion, APIService, name)
			body["spec"] = map[string]any{"caBundle": bundle}
			return body
		},
		transform: trimAPIService,
	}
}
