// Package webhooks holds the sample operator's admission webhooks for
// Widgets (a defaulter and a validator on the hub version, v1), and
// registers them with the conversion webhook, as kubebuilder scaffolds
// internal/webhook/v1. Both the evercert operator and its cert-controller
// counterpart (controllerruntime/example/certcontroller) call
// SetupWidgetWebhookWithManager; only their certificate wiring differs. See
// docs/architecture.md.
package webhooks

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/evercert/evercert/controllerruntime/example/operator/api/v1"
)

// Paths controller-runtime serves the webhooks at (derived from the group,
// version and kind, as the webhook configurations name them).
const (
	MutatePath   = "/mutate-example-evercert-io-v1-widget"
	ValidatePath = "/validate-example-evercert-io-v1-widget"
	ConvertPath  = "/convert"
)

// MutatedByAnnotation names the replica whose defaulter admitted a Widget:
// the end-to-end test reads it to see that every replica serves.
const MutatedByAnnotation = "example.evercert.io/mutated-by"

// SetupWidgetWebhookWithManager registers the defaulting, validating and
// conversion (v2 is Convertible to the hub v1) webhooks for Widgets with
// mgr's webhook server. replica names this process in MutatedByAnnotation.
func SetupWidgetWebhookWithManager(mgr ctrl.Manager, replica string) error {
	return ctrl.NewWebhookManagedBy(mgr, &v1.Widget{}).
		WithDefaulter(&WidgetDefaulter{Replica: replica}).
		WithValidator(&WidgetValidator{}).
		Complete()
}

// +kubebuilder:webhook:path=/mutate-example-evercert-io-v1-widget,mutating=true,failurePolicy=fail,sideEffects=None,groups=example.evercert.io,resources=widgets,verbs=create;update,versions=v1,name=mwidget-v1.kb.io,admissionReviewVersions=v1

// WidgetDefaulter sets a Widget's defaults.
type WidgetDefaulter struct {
	// Replica is written to MutatedByAnnotation.
	Replica string
}

var _ admission.Defaulter[*v1.Widget] = &WidgetDefaulter{}

// Default sets Size and Color when unset and records the replica.
func (d *WidgetDefaulter) Default(_ context.Context, w *v1.Widget) error {
	if w.Spec.Size == 0 {
		w.Spec.Size = v1.DefaultSize
	}
	if w.Spec.Color == "" {
		w.Spec.Color = v1.DefaultColor
	}
	if d.Replica != "" {
		if w.Annotations == nil {
			w.Annotations = map[string]string{}
		}
		w.Annotations[MutatedByAnnotation] = d.Replica
	}
	return nil
}

// +kubebuilder:webhook:path=/validate-example-evercert-io-v1-widget,mutating=false,failurePolicy=fail,sideEffects=None,groups=example.evercert.io,resources=widgets,verbs=create;update,versions=v1,name=vwidget-v1.kb.io,admissionReviewVersions=v1

// WidgetValidator refuses Widgets whose Size is out of range.
type WidgetValidator struct{}

var _ admission.Validator[*v1.Widget] = &WidgetValidator{}

// ValidateCreate checks a new Widget.
func (v *WidgetValidator) ValidateCreate(_ context.Context, w *v1.Widget) (admission.Warnings, error) {
	return nil, validate(w)
}

// ValidateUpdate checks a changed Widget.
func (v *WidgetValidator) ValidateUpdate(_ context.Context, _, w *v1.Widget) (admission.Warnings, error) {
	return nil, validate(w)
}

// ValidateDelete allows every deletion.
func (v *WidgetValidator) ValidateDelete(context.Context, *v1.Widget) (admission.Warnings, error) {
	return nil, nil
}

func validate(w *v1.Widget) error {
	if w.Spec.Size < 1 || w.Spec.Size > v1.MaxSize {
		return field.Invalid(field.NewPath("spec", "size"), w.Spec.Size, fmt.Sprintf("must be between 1 and %d", v1.MaxSize))
	}
	return nil
}
