package cabundle

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apiextensionsinformers "k8s.io/apiextensions-apiserver/pkg/client/informers/externalversions/apiextensions/v1"
)

// CustomResourceDefinition is an apiextensions.k8s.io/v1
// CustomResourceDefinition; the field is
// spec.conversion.webhook.clientConfig.caBundle, written only while the
// conversion strategy is Webhook. Its client is
// PublisherConfig.APIExtensionsClient.
const CustomResourceDefinition Kind = "CustomResourceDefinition"

func init() {
	registerKind(CustomResourceDefinition, withClient((*clients).apiExtensions, crdAdapter))
}

var crdAPIVersion = apiextensionsv1.SchemeGroupVersion.String()

func crdAdapter(client apiextensionsclient.Interface) *kindAdapter {
	return &kindAdapter{
		kind:        CustomResourceDefinition,
		apiVersion:  crdAPIVersion,
		newInformer: informerOf(apiextensionsinformers.NewFilteredCustomResourceDefinitionInformer, client),
		view:        viewOf(crdView),
		patch:       patchVia(client.ApiextensionsV1().CustomResourceDefinitions()),
		applyBody:   crdApplyBody,
		transform:   trimCRD,
	}
}

// crdView extracts the conversion webhook slot of a CRD.
func crdView(o *apiextensionsv1.CustomResourceDefinition) objectView {
	v := newView(o)
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
			s.service = &ServiceRef{Namespace: cc.Service.Namespace, Name: cc.Service.Name}
		}
		v.slots = []slot{s}
	}
	return v
}

// crdApplyBody is the apply object of a CRD: the conversion webhook's
// caBundle.
func crdApplyBody(name string, _ []slot, bundle []byte) map[string]any {
	body := applyHeader(crdAPIVersion, CustomResourceDefinition, name)
	// strategy is deliberately absent: it belongs to whoever installed the
	// CRD, and the merged object keeps theirs.
	body["spec"] = map[string]any{"conversion": map[string]any{"webhook": map[string]any{
		"clientConfig": map[string]any{"caBundle": bundle},
	}}}
	return body
}

// trimCRD is trimmed, and also drops the versions (with their OpenAPI
// schemas, easily hundreds of kilobytes per CRD) and the status: the JSON
// patch addresses the conversion webhook by a fixed path and the apply
// object is built from scratch, so a trimmed cached copy is as good as the
// full one.
func trimCRD(obj any) (any, error) {
	out, err := trimmed[apiextensionsv1.CustomResourceDefinition](obj)
	if c, ok := out.(*apiextensionsv1.CustomResourceDefinition); ok {
		c.Spec.Versions = nil
		c.Status = apiextensionsv1.CustomResourceDefinitionStatus{}
	}
	return out, err
}
