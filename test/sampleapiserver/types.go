package sampleapiserver

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	// GroupName is the API group the server serves.
	GroupName = "sample.evercert.io"
	// Resource is the plural resource name of Flunder.
	Resource = "flunders"
)

// SchemeGroupVersion is the served version, sample.evercert.io/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// internalGroupVersion is the in-memory hub version. The types are the same
// Go types in both versions, so no conversion functions are needed: the
// scheme converts between them by setting the kind.
var internalGroupVersion = schema.GroupVersion{Group: GroupName, Version: runtime.APIVersionInternal}

// FlunderGroupVersionResource is the resource's GroupVersionResource, for
// dynamic clients and informers.
var FlunderGroupVersionResource = SchemeGroupVersion.WithResource(Resource)

// Flunder is the one resource of the sample API: a namespaced object whose
// spec may name another Flunder.
type Flunder struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec FlunderSpec `json:"spec,omitempty"`
}

// FlunderSpec is the desired state of a Flunder.
type FlunderSpec struct {
	// Reference names another Flunder in the same namespace. When set, the
	// RequireReference admission plugin admits the Flunder only if the
	// referenced one is in its informer's cache. Empty: no reference.
	Reference string `json:"reference,omitempty"`
}

// FlunderList is a list of Flunders.
type FlunderList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []Flunder `json:"items"`
}

// OpenAPI model names, the keys of GetOpenAPIDefinitions.
const (
	flunderModel     = "io.evercert.sample.v1alpha1.Flunder"
	flunderSpecModel = "io.evercert.sample.v1alpha1.FlunderSpec"
	flunderListModel = "io.evercert.sample.v1alpha1.FlunderList"
)

// OpenAPIModelName returns the name of the Flunder OpenAPI model.
func (Flunder) OpenAPIModelName() string { return flunderModel }

// OpenAPIModelName returns the name of the FlunderSpec OpenAPI model.
func (FlunderSpec) OpenAPIModelName() string { return flunderSpecModel }

// OpenAPIModelName returns the name of the FlunderList OpenAPI model.
func (FlunderList) OpenAPIModelName() string { return flunderListModel }

// DeepCopyInto copies in into out.
func (in *Flunder) DeepCopyInto(out *Flunder) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = in.Spec
}

// DeepCopy returns a deep copy of in.
func (in *Flunder) DeepCopy() *Flunder {
	if in == nil {
		return nil
	}
	out := new(Flunder)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *Flunder) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies in into out.
func (in *FlunderList) DeepCopyInto(out *FlunderList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Flunder, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a deep copy of in.
func (in *FlunderList) DeepCopy() *FlunderList {
	if in == nil {
		return nil
	}
	out := new(FlunderList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *FlunderList) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// addKnownTypes registers the types in the served and the internal version.
func addKnownTypes(scheme *runtime.Scheme) error {
	for _, gv := range []schema.GroupVersion{SchemeGroupVersion, internalGroupVersion} {
		scheme.AddKnownTypes(gv, &Flunder{}, &FlunderList{})
	}
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return scheme.SetVersionPriority(SchemeGroupVersion)
}
