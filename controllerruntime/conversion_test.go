package controllerruntime

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

// The CRD of the conversion webhook in TestAddWebhookThroughRotationsOnNonLeader:
// widgets stored as v1 and served as v2 too, converted by the webhook.
const (
	crdGroup    = "evercert.test"
	crdName     = "widgets." + crdGroup
	convertPath = "/convert"
)

var widgetsV2 = schema.GroupVersionResource{Group: crdGroup, Version: "v2", Resource: "widgets"}

func widgetCRD(port int) *apiextensionsv1.CustomResourceDefinition {
	url := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + convertPath
	schemaAny := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type: "object", XPreserveUnknownFields: ptr.To(true),
	}}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: crdName},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: crdGroup, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1", Served: true, Storage: true, Schema: schemaAny},
				{Name: "v2", Served: true, Schema: schemaAny},
			},
			Conversion: &apiextensionsv1.CustomResourceConversion{
				Strategy: apiextensionsv1.WebhookConverter,
				Webhook: &apiextensionsv1.WebhookConversion{
					ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: &url},
					ConversionReviewVersions: []string{"v1"},
				},
			},
		},
	}
}

// convertHandler is a conversion webhook that changes only apiVersion
// (the two versions have the same schema), counting its calls.
func convertHandler(calls *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var review apiextensionsv1.ConversionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "bad ConversionReview", http.StatusBadRequest)
			return
		}
		resp := &apiextensionsv1.ConversionResponse{UID: review.Request.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
		for _, obj := range review.Request.Objects {
			var u map[string]any
			if err := json.Unmarshal(obj.Raw, &u); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			u["apiVersion"] = review.Request.DesiredAPIVersion
			raw, _ := json.Marshal(u)
			resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Raw: raw})
		}
		review.Request, review.Response = nil, resp
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&review)
	})
}
