package sampleapiserver

import (
	"context"
	"fmt"

	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage/names"
)

// strategy is the create, update and delete strategy of flunders: namespaced,
// names validated as DNS subdomains, nothing else to default or check.
type strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
}

func (strategy) NamespaceScoped() bool                                            { return true }
func (strategy) PrepareForCreate(context.Context, runtime.Object)                 {}
func (strategy) PrepareForUpdate(context.Context, runtime.Object, runtime.Object) {}
func (strategy) WarningsOnCreate(context.Context, runtime.Object) []string        { return nil }
func (strategy) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}
func (strategy) AllowCreateOnUpdate(context.Context) bool      { return false }
func (strategy) AllowUnconditionalUpdate(context.Context) bool { return false }
func (strategy) Canonicalize(runtime.Object)                   {}

func (strategy) Validate(_ context.Context, obj runtime.Object) field.ErrorList {
	f, ok := obj.(*Flunder)
	if !ok {
		return field.ErrorList{field.InternalError(nil, fmt.Errorf("not a Flunder: %T", obj))}
	}
	return apivalidation.ValidateObjectMeta(&f.ObjectMeta, true, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
}

func (s strategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	f, ok := obj.(*Flunder)
	oldF, oldOK := old.(*Flunder)
	if !ok || !oldOK {
		return field.ErrorList{field.InternalError(nil, fmt.Errorf("not a Flunder: %T, %T", obj, old))}
	}
	return apivalidation.ValidateObjectMetaUpdate(&f.ObjectMeta, &oldF.ObjectMeta, field.NewPath("metadata"))
}

// newFlunderStorage returns the etcd-backed storage of flunders.
func newFlunderStorage(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (*genericregistry.Store, error) {
	s := strategy{ObjectTyper: scheme, NameGenerator: names.SimpleNameGenerator}
	resource := SchemeGroupVersion.WithResource(Resource).GroupResource()
	store := &genericregistry.Store{
		NewFunc:                   func() runtime.Object { return &Flunder{} },
		NewListFunc:               func() runtime.Object { return &FlunderList{} },
		DefaultQualifiedResource:  resource,
		SingularQualifiedResource: SchemeGroupVersion.WithResource("flunder").GroupResource(),
		CreateStrategy:            s,
		UpdateStrategy:            s,
		DeleteStrategy:            s,
		TableConvertor:            rest.NewDefaultTableConvertor(resource),
	}
	if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: optsGetter}); err != nil {
		return nil, fmt.Errorf("flunder storage: %w", err)
	}
	return store, nil
}
