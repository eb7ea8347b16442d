package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of this package's types.
const GroupName = "certificates.evercert.io"

// Names of the one resource of the group.
const (
	// Resource is the plural resource name.
	Resource = "servingcertificates"
	// SingularResource is the singular resource name.
	SingularResource = "servingcertificate"
	// Kind is the kind of one item.
	Kind = "ServingCertificate"
	// ListKind is the kind of the list.
	ListKind = "ServingCertificateList"
)

// SchemeGroupVersion is the group version of this package's types.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Verbs are the verbs the resource supports: it is read-only and cannot be
// watched.
var Verbs = []string{"get", "list"}

var (
	// SchemeBuilder registers the types of this package.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// GroupResource returns the GroupResource of servingcertificates.
func GroupResource() schema.GroupResource {
	return SchemeGroupVersion.WithResource(Resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &ServingCertificate{}, &ServingCertificateList{})
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
