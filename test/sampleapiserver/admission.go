package sampleapiserver

import (
	"context"
	"errors"
	"fmt"
	"io"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// PluginName is the name of the admission plugin that checks
// spec.reference against its informer's cache.
const PluginName = "RequireReference"

// registerPlugin registers RequireReference in plugins.
func registerPlugin(plugins *admission.Plugins) {
	plugins.Register(PluginName, func(io.Reader) (admission.Interface, error) {
		return &requireReference{Handler: admission.NewHandler(admission.Create)}, nil
	})
}

// wantsFlunderInformer is implemented by admission plugins that read
// flunders through an informer; flunderInitializer hands it to them.
type wantsFlunderInformer interface {
	SetFlunderInformer(informers.GenericInformer)
}

// flunderInitializer is the admission.PluginInitializer returned from
// ExtraAdmissionInitializers, as sample-apiserver's wardleinitializer.
type flunderInitializer struct {
	informer informers.GenericInformer
}

// Initialize hands the informer to plugins that want it.
func (i flunderInitializer) Initialize(p admission.Interface) {
	if w, ok := p.(wantsFlunderInformer); ok {
		w.SetFlunderInformer(i.informer)
	}
}

// requireReference rejects the creation of a Flunder whose spec.reference
// names a Flunder that its informer has not seen. The informer reads the
// server's own API through the loopback client config, so this plugin works
// only while that client does.
type requireReference struct {
	*admission.Handler
	lister cache.GenericLister
}

var (
	_ admission.ValidationInterface     = &requireReference{}
	_ admission.InitializationValidator = &requireReference{}
	_ wantsFlunderInformer              = &requireReference{}
)

// SetFlunderInformer implements wantsFlunderInformer: the plugin is ready
// once the informer has synced.
func (p *requireReference) SetFlunderInformer(i informers.GenericInformer) {
	p.lister = i.Lister()
	p.SetReadyFunc(i.Informer().HasSynced)
}

// ValidateInitialization fails when no informer was handed over.
func (p *requireReference) ValidateInitialization() error {
	if p.lister == nil {
		return fmt.Errorf("%s: no flunder informer: the initializer from ExtraAdmissionInitializers is missing", PluginName)
	}
	return nil
}

// Validate admits a new Flunder when its spec.reference is empty or names a
// Flunder of the same namespace in the informer's cache.
func (p *requireReference) Validate(_ context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if a.GetResource().GroupResource() != FlunderGroupVersionResource.GroupResource() || a.GetSubresource() != "" {
		return nil
	}
	if !p.WaitForReady() {
		return admission.NewForbidden(a, errors.New("not yet ready: the flunder informer has not synced"))
	}
	f, ok := a.GetObject().(*Flunder)
	if !ok {
		return apierrors.NewBadRequest(fmt.Sprintf("%s: unexpected object %T", PluginName, a.GetObject()))
	}
	if f.Spec.Reference == "" {
		return nil
	}
	if _, err := p.lister.ByNamespace(a.GetNamespace()).Get(f.Spec.Reference); err != nil {
		if apierrors.IsNotFound(err) {
			return admission.NewForbidden(a, fmt.Errorf("%s: spec.reference %q is not in the informer's cache", PluginName, f.Spec.Reference))
		}
		return apierrors.NewInternalError(fmt.Errorf("%s: reading %q from the informer's cache: %w", PluginName, f.Spec.Reference, err))
	}
	return nil
}
