package cabundle

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// This file holds the one adapter of the two webhook configuration kinds
// (kind_validating.go, kind_mutating.go): their caBundle fields are
// webhooks[*].clientConfig.caBundle, and they differ only in their Go types.

// webhookAPIVersion is the apiVersion of both webhook configuration kinds.
var webhookAPIVersion = admissionregistrationv1.SchemeGroupVersion.String()

// webhookKind describes a webhook configuration kind by its Go types: O is
// the configuration, W its webhook.
type webhookKind[O any, PO objectPtr[O], W any] struct {
	kind        Kind
	newInformer func(tweak func(*metav1.ListOptions)) cache.SharedIndexInformer
	client      patcher[PO]
	// webhooks returns the webhooks of a configuration.
	webhooks func(PO) []W
	// webhook returns the name and client configuration of a webhook.
	webhook func(W) (string, admissionregistrationv1.WebhookClientConfig)
}

// adapter returns the kindAdapter of k.
func (k webhookKind[O, PO, W]) adapter() *kindAdapter {
	return &kindAdapter{
		kind:        k.kind,
		apiVersion:  webhookAPIVersion,
		newInformer: k.newInformer,
		view:        viewOf(k.view),
		patch:       patchVia(k.client),
		applyBody:   k.applyBody,
		transform:   trimmed[O, PO],
		indexed:     true,
	}
}

// view has a slot per webhook, in list order.
func (k webhookKind[O, PO, W]) view(o PO) objectView {
	v := newView(o)
	for i, wh := range k.webhooks(o) {
		name, cc := k.webhook(wh)
		s := slot{
			path:    fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i),
			webhook: name,
			current: cc.CABundle,
		}
		if cc.Service != nil {
			s.service = &ServiceRef{Namespace: cc.Service.Namespace, Name: cc.Service.Name}
		}
		v.slots = append(v.slots, s)
	}
	if len(v.slots) == 0 {
		v.none = "it has no webhooks"
	}
	return v
}

// applyBody is the apply object of a webhook configuration: each selected
// webhook's name (the list-map key, without which the entry cannot be
// addressed) and its clientConfig.caBundle.
func (k webhookKind[O, PO, W]) applyBody(name string, slots []slot, bundle []byte) map[string]any {
	body := applyHeader(webhookAPIVersion, k.kind, name)
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
