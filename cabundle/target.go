package cabundle

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Kind is the kind of object a [Target] writes into. Its value is the
// Kubernetes kind name, and is also the "kind" label of
// evercert_cabundle_publish_total.
type Kind string

// The kinds a [Publisher] can write into.
const (
	// ValidatingWebhookConfiguration is an admissionregistration.k8s.io/v1
	// ValidatingWebhookConfiguration; the field is
	// webhooks[*].clientConfig.caBundle.
	ValidatingWebhookConfiguration Kind = "ValidatingWebhookConfiguration"
	// MutatingWebhookConfiguration is an admissionregistration.k8s.io/v1
	// MutatingWebhookConfiguration; the field is
	// webhooks[*].clientConfig.caBundle.
	MutatingWebhookConfiguration Kind = "MutatingWebhookConfiguration"
	// CustomResourceDefinition is an apiextensions.k8s.io/v1
	// CustomResourceDefinition; the field is
	// spec.conversion.webhook.clientConfig.caBundle, written only while the
	// conversion strategy is Webhook.
	CustomResourceDefinition Kind = "CustomResourceDefinition"
	// APIService is an apiregistration.k8s.io/v1 APIService; the field is
	// spec.caBundle, written only for APIServices with a spec.service.
	APIService Kind = "APIService"
)

// Target selects the objects of one kind whose caBundle a [Publisher] keeps
// up to date. Exactly one of Name and Selector must be set.
type Target struct {
	// Kind is the kind of the objects. Required.
	Kind Kind
	// Name selects the single object with this name. The object need not
	// exist yet: the publisher waits for it.
	Name string
	// Selector selects every object whose labels match, including objects
	// created later. labels.Everything() selects every object of the kind.
	Selector labels.Selector
	// Service, when set, restricts the fields written to those whose client
	// configuration refers to this Service: for webhook configurations the
	// webhooks whose clientConfig.service matches, for a
	// CustomResourceDefinition its conversion webhook's clientConfig.service,
	// for an APIService its spec.service. Fields that refer to a URL, or to
	// another Service, are then left alone. When nil, every caBundle field of
	// a selected object is written.
	Service *ServiceRef
}

// ServiceRef names a Service by namespace and name.
type ServiceRef struct {
	Namespace string
	Name      string
}

// String returns "namespace/name".
func (s ServiceRef) String() string { return s.Namespace + "/" + s.Name }

// String describes the target for logs and error messages, e.g.
// `ValidatingWebhookConfiguration "x"` or
// `APIService with labels "app=y"`.
func (t Target) String() string {
	var s string
	if t.Name != "" {
		s = fmt.Sprintf("%s %q", t.Kind, t.Name)
	} else {
		sel := "<nil>"
		if t.Selector != nil {
			sel = t.Selector.String()
		}
		s = fmt.Sprintf("%s with labels %q", t.Kind, sel)
	}
	if t.Service != nil {
		s += " (service " + t.Service.String() + ")"
	}
	return s
}

// validate checks that the target is complete and unambiguous.
func (t Target) validate() error {
	switch t.Kind {
	case ValidatingWebhookConfiguration, MutatingWebhookConfiguration, CustomResourceDefinition, APIService:
	case "":
		return errors.New("kind is not set")
	default:
		return fmt.Errorf("unsupported kind %q", t.Kind)
	}
	switch {
	case t.Name == "" && t.Selector == nil:
		return errors.New("neither name nor selector is set")
	case t.Name != "" && t.Selector != nil:
		return errors.New("both name and selector are set")
	case t.Name != "":
		// Every one of these kinds is named like a DNS subdomain; checking
		// here turns a typo into an error at start-up instead of a target
		// that waits forever.
		if errs := validation.IsDNS1123Subdomain(t.Name); len(errs) > 0 {
			return fmt.Errorf("invalid name %q: %v", t.Name, errs)
		}
	}
	if t.Service != nil && (t.Service.Namespace == "" || t.Service.Name == "") {
		return fmt.Errorf("service %q needs both namespace and name", t.Service.String())
	}
	return nil
}

// selects reports whether the target covers the object with this name and
// these labels. The informers already filter on the server, but the check is
// repeated so that correctness does not depend on that filter (fake clients
// ignore field selectors, for one).
func (t Target) selects(name string, objLabels map[string]string) bool {
	if t.Name != "" {
		return t.Name == name
	}
	return t.Selector.Matches(labels.Set(objLabels))
}

// wantsService reports whether a field whose client configuration refers to
// svc (nil for a URL) is covered by the target's Service filter.
func (t Target) wantsService(svc *ServiceRef) bool {
	if t.Service == nil {
		return true
	}
	return svc != nil && *svc == *t.Service
}
