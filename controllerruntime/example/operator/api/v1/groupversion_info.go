// Package v1 is the storage version (the conversion hub) of the sample
// operator's Widget API, example.evercert.io/v1, as kubebuilder scaffolds
// an API package. See controllerruntime/example/operator and
// docs/architecture.md.
package v1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this package's objects.
	GroupVersion = schema.GroupVersion{Group: "example.evercert.io", Version: "v1"}

	// SchemeBuilder registers this package's types in a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
