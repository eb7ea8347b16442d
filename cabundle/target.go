package cabundle

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
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
	// created later. It must have at least one requirement: a selector that
	// matches every object (labels.Everything(), an empty selector) is
	// refused, since publishing one caBundle into every object of a kind in
	// the cluster is never intended, and so is labels.Nothing().
	Selector labels.Selector
	// Service, when set, restricts the fields written to those whose client
	// configuration refers to this Service: for webhook configurations the
	// webhooks whose clientConfig.service matches, for a
	// CustomResourceDefinition its conversion webhook's clientConfig.service,
	// for an APIService its spec.service. Fields that refer to a URL, or to
	// another Service, are then left alone. When nil, every caBundle field of
	// a selected object is written.
	Service *ServiceRef
	// SignerName is the spec.signerName of a ClusterTrustBundle the
	// publisher creates for a named target of that kind, where it is
	// required; Name must then start with the prefix the API server
	// requires (see ClusterTrustBundleName). It must be empty for every
	// other target.
	SignerName string
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

// validate checks that the target is complete and unambiguous. Its errors
// start with field, the target's place in the configuration (such as
// "PublisherConfig.Targets[1]"), followed by the offending field of Target.
func (t Target) validate(field string) error {
	if t.Kind == "" {
		return fmt.Errorf("%s.Kind is not set", field)
	}
	if _, ok := kinds[t.Kind]; !ok {
		return fmt.Errorf("%s.Kind %q is not supported (supported: %v)", field, t.Kind, registeredKinds())
	}
	switch {
	case t.Name == "" && t.Selector == nil:
		return fmt.Errorf("%s: neither Name nor Selector is set", field)
	case t.Name != "" && t.Selector != nil:
		return fmt.Errorf("%s: both Name and Selector are set", field)
	case t.Name != "" && t.Kind == ClusterTrustBundle:
		// Named like a path segment: the signer prefix holds colons.
		if errs := content.IsPathSegmentName(t.Name); len(errs) > 0 {
			return fmt.Errorf("%s.Name %q is invalid: %s", field, t.Name, strings.Join(errs, "; "))
		}
	case t.Name != "":
		// Every other kind is named like a DNS subdomain; checking
		// here turns a typo into an error at start-up instead of a target
		// that waits forever.
		if errs := validation.IsDNS1123Subdomain(t.Name); len(errs) > 0 {
			return fmt.Errorf("%s.Name %q is invalid: %s", field, t.Name, strings.Join(errs, "; "))
		}
	case t.Selector.Empty():
		return fmt.Errorf("%s.Selector %q matches every %s of the cluster, which is never intended; select the objects with at least one label requirement",
			field, t.Selector.String(), t.Kind)
	default:
		if _, selectable := t.Selector.Requirements(); !selectable {
			return fmt.Errorf("%s.Selector matches nothing (labels.Nothing())", field)
		}
	}
	if t.Kind == ClusterTrustBundle {
		if err := t.validateClusterTrustBundle(field); err != nil {
			return err
		}
	} else if t.SignerName != "" {
		return fmt.Errorf("%s.SignerName is set, but only a ClusterTrustBundle target has a signer name", field)
	}
	if t.Service != nil && (t.Service.Namespace == "" || t.Service.Name == "") {
		return fmt.Errorf("%s.Service %q needs both Namespace and Name", field, t.Service.String())
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

// objectKey identifies one object, e.g. "ValidatingWebhookConfiguration/x",
// in the publisher's bookkeeping, in Pending and in the health check.
func objectKey(kind Kind, name string) string { return string(kind) + "/" + name }
