package sampleapiserver

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"

	extensionsopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
)

// GetOpenAPIDefinitions returns the OpenAPI models of the sample API and of
// everything it refers to. genericapiserver needs them for server-side apply
// and managed fields; the meta/v1 models come from apiextensions-apiserver's
// generated definitions, which hold them all.
func GetOpenAPIDefinitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := extensionsopenapi.GetOpenAPIDefinitions(ref)
	str := func(description string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{Description: description, Type: []string{"string"}}}
	}
	typeMeta := func(description string, props map[string]spec.Schema) spec.Schema {
		props["kind"] = str("Kind is a string value representing the REST resource this object represents.")
		props["apiVersion"] = str("APIVersion defines the versioned schema of this representation of an object.")
		return spec.Schema{SchemaProps: spec.SchemaProps{Description: description, Type: []string{"object"}, Properties: props}}
	}
	objectMeta, listMeta := metav1.ObjectMeta{}.OpenAPIModelName(), metav1.ListMeta{}.OpenAPIModelName()

	defs[flunderModel] = common.OpenAPIDefinition{
		Schema: typeMeta("Flunder is a namespaced object whose spec may name another Flunder.", map[string]spec.Schema{
			"metadata": {SchemaProps: spec.SchemaProps{Default: map[string]any{}, Ref: ref(objectMeta)}},
			"spec":     {SchemaProps: spec.SchemaProps{Default: map[string]any{}, Ref: ref(flunderSpecModel)}},
		}),
		Dependencies: []string{objectMeta, flunderSpecModel},
	}
	defs[flunderSpecModel] = common.OpenAPIDefinition{
		Schema: spec.Schema{SchemaProps: spec.SchemaProps{
			Description: "FlunderSpec is the desired state of a Flunder.",
			Type:        []string{"object"},
			Properties: map[string]spec.Schema{
				"reference": str("Reference names another Flunder in the same namespace, which must exist when this one is created."),
			},
		}},
	}
	defs[flunderListModel] = common.OpenAPIDefinition{
		Schema: typeMeta("FlunderList is a list of Flunders.", map[string]spec.Schema{
			"metadata": {SchemaProps: spec.SchemaProps{Default: map[string]any{}, Ref: ref(listMeta)}},
			"items": {SchemaProps: spec.SchemaProps{
				Type:  []string{"array"},
				Items: &spec.SchemaOrArray{Schema: &spec.Schema{SchemaProps: spec.SchemaProps{Default: map[string]any{}, Ref: ref(flunderModel)}}},
			}},
		}),
		Dependencies: []string{listMeta, flunderModel},
	}
	return defs
}
