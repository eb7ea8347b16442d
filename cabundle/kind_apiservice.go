package cabundle

import (
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	apiregistrationinformers "k8s.io/kube-aggregator/pkg/client/informers/externalversions/apiregistration/v1"
)

// APIService is an apiregistration.k8s.io/v1 APIService; the field is
// spec.caBundle, written only for APIServices with a spec.service. Its
// client is PublisherConfig.AggregatorClient.
const APIService Kind = "APIService"

func init() {
	registerKind(APIService, withClient((*clients).aggregator, apiServiceAdapter))
}

var apiServiceAPIVersion = apiregistrationv1.SchemeGroupVersion.String()

func apiServiceAdapter(client aggregatorclient.Interface) *kindAdapter {
	return &kindAdapter{
		kind:        APIService,
		apiVersion:  apiServiceAPIVersion,
		newInformer: informerOf(apiregistrationinformers.NewFilteredAPIServiceInformer, client),
		view:        viewOf(apiServiceView),
		patch:       patchVia(client.ApiregistrationV1().APIServices()),
		applyBody: func(name string, _ []slot, bundle []byte) map[string]any {
			body := applyHeader(apiServiceAPIVersion, APIService, name)
			body["spec"] = map[string]any{"caBundle": bundle}
			return body
		},
		transform: trimmed[apiregistrationv1.APIService],
	}
}

// apiServiceView extracts the spec.caBundle slot of an APIService.
func apiServiceView(o *apiregistrationv1.APIService) objectView {
	v := newView(o)
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
			service: &ServiceRef{Namespace: o.Spec.Service.Namespace, Name: o.Spec.Service.Name},
		}}
	}
	return v
}
