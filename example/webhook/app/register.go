package app

import (
	"context"
	"fmt"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/errlog"
)

// Labels of the configurations the webhook registers itself (--register-url).
const (
	// ManagedByLabel is set to ManagedByValue on them.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// ManagedByValue is the value of ManagedByLabel.
	ManagedByValue = "evercert-example-webhook"
)

// Registration describes the webhook configurations registered by URL.
type Registration struct {
	// BaseURL is https://HOST:PORT; ValidatePath and MutatePath are appended.
	BaseURL string
	// Validating and Mutating name the configurations; empty skips one.
	Validating, Mutating string
	// Namespace, when set, selects that namespace (by its
	// kubernetes.io/metadata.name label) instead of the namespaces labelled
	// EnabledNamespaceLabel=EnabledNamespaceValue.
	Namespace string
}

// namespaceSelector selects the namespaces the rule applies to.
func (r Registration) namespaceSelector() *metav1.LabelSelector {
	if r.Namespace != "" {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": r.Namespace}}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{EnabledNamespaceLabel: EnabledNamespaceValue}}
}

func configMapRules() []admissionregistrationv1.RuleWithOperations {
	return []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"},
			Scope: ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}}
}

// ValidatingWebhook returns the desired validating webhook, trusting
// caBundle.
func (r Registration) ValidatingWebhook(caBundle []byte) admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
		Name:                    ValidatingWebhookName,
		ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(r.BaseURL + ValidatePath), CABundle: caBundle},
		Rules:                   configMapRules(),
		NamespaceSelector:       r.namespaceSelector(),
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
		TimeoutSeconds:          ptr.To[int32](5),
	}
}

// MutatingWebhook returns the desired mutating webhook, trusting caBundle.
func (r Registration) MutatingWebhook(caBundle []byte) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name:                    MutatingWebhookName,
		ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(r.BaseURL + MutatePath), CABundle: caBundle},
		Rules:                   configMapRules(),
		NamespaceSelector:       r.namespaceSelector(),
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
		TimeoutSeconds:          ptr.To[int32](5),
	}
}

// Register creates or updates the configurations so that each holds exactly
// the one webhook of this app, pointing at BaseURL. caBundle is the bundle to
// trust now (the publisher keeps it current afterwards); when it is empty an
// existing caBundle is kept. Fields the API server defaults are left as they
// are, and an object that is already right is not written.
func (r Registration) Register(ctx context.Context, client kubernetes.Interface, caBundle []byte) error {
	if r.Validating != "" {
		if err := r.registerValidating(ctx, client, caBundle); err != nil {
			return fmt.Errorf("ValidatingWebhookConfiguration %q: %w", r.Validating, err)
		}
	}
	if r.Mutating != "" {
		if err := r.registerMutating(ctx, client, caBundle); err != nil {
			return fmt.Errorf("MutatingWebhookConfiguration %q: %w", r.Mutating, err)
		}
	}
	return nil
}

func managedMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{ManagedByLabel: ManagedByValue}}
}

func (r Registration) registerValidating(ctx context.Context, client kubernetes.Interface, caBundle []byte) error {
	logger := klog.FromContext(ctx)
	api := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, r.Validating, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			obj := &admissionregistrationv1.ValidatingWebhookConfiguration{
				ObjectMeta: managedMeta(r.Validating),
				Webhooks:   []admissionregistrationv1.ValidatingWebhook{r.ValidatingWebhook(caBundle)},
			}
			if _, err = api.Create(ctx, obj, metav1.CreateOptions{}); err == nil {
				logger.Info("Registered webhook configuration", "kind", "ValidatingWebhookConfiguration", "name", r.Validating, "url", *obj.Webhooks[0].ClientConfig.URL)
			} else if apierrors.IsAlreadyExists(err) {
				// Created by a concurrent replica: update it instead.
				err = apierrors.NewConflict(admissionregistrationv1.Resource("validatingwebhookconfigurations"), r.Validating, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		want := r.ValidatingWebhook(caBundle)
		upd := cur.DeepCopy()
		upd.Webhooks = []admissionregistrationv1.ValidatingWebhook{want}
		for _, h := range cur.Webhooks {
			if h.Name == want.Name {
				merged := h
				merged.ClientConfig = want.ClientConfig
				if len(caBundle) == 0 {
					merged.ClientConfig.CABundle = h.ClientConfig.CABundle
				}
				merged.Rules, merged.NamespaceSelector = want.Rules, want.NamespaceSelector
				merged.FailurePolicy, merged.SideEffects = want.FailurePolicy, want.SideEffects
				merged.AdmissionReviewVersions, merged.TimeoutSeconds = want.AdmissionReviewVersions, want.TimeoutSeconds
				upd.Webhooks[0] = merged
			}
		}
		if upd.Labels == nil {
			upd.Labels = map[string]string{}
		}
		upd.Labels[ManagedByLabel] = ManagedByValue
		if apiequality.Semantic.DeepEqual(cur, upd) {
			logger.V(2).Info("Webhook configuration already registered", "kind", "ValidatingWebhookConfiguration", "name", r.Validating)
			return nil
		}
		if _, err := api.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return err
		}
		logger.Info("Updated webhook configuration", "kind", "ValidatingWebhookConfiguration", "name", r.Validating, "url", *want.ClientConfig.URL)
		return nil
	})
}

func (r Registration) registerMutating(ctx context.Context, client kubernetes.Interface, caBundle []byte) error {
	logger := klog.FromContext(ctx)
	api := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, r.Mutating, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			obj := &admissionregistrationv1.MutatingWebhookConfiguration{
				ObjectMeta: managedMeta(r.Mutating),
				Webhooks:   []admissionregistrationv1.MutatingWebhook{r.MutatingWebhook(caBundle)},
			}
			if _, err = api.Create(ctx, obj, metav1.CreateOptions{}); err == nil {
				logger.Info("Registered webhook configuration", "kind", "MutatingWebhookConfiguration", "name", r.Mutating, "url", *obj.Webhooks[0].ClientConfig.URL)
			} else if apierrors.IsAlreadyExists(err) {
				err = apierrors.NewConflict(admissionregistrationv1.Resource("mutatingwebhookconfigurations"), r.Mutating, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		want := r.MutatingWebhook(caBundle)
		upd := cur.DeepCopy()
		upd.Webhooks = []admissionregistrationv1.MutatingWebhook{want}
		for _, h := range cur.Webhooks {
			if h.Name == want.Name {
				merged := h
				merged.ClientConfig = want.ClientConfig
				if len(caBundle) == 0 {
					merged.ClientConfig.CABundle = h.ClientConfig.CABundle
				}
				merged.Rules, merged.NamespaceSelector = want.Rules, want.NamespaceSelector
				merged.FailurePolicy, merged.SideEffects = want.FailurePolicy, want.SideEffects
				merged.AdmissionReviewVersions, merged.TimeoutSeconds = want.AdmissionReviewVersions, want.TimeoutSeconds
				upd.Webhooks[0] = merged
			}
		}
		if upd.Labels == nil {
			upd.Labels = map[string]string{}
		}
		upd.Labels[ManagedByLabel] = ManagedByValue
		if apiequality.Semantic.DeepEqual(cur, upd) {
			logger.V(2).Info("Webhook configuration already registered", "kind", "MutatingWebhookConfiguration", "name", r.Mutating)
			return nil
		}
		if _, err := api.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return err
		}
		logger.Info("Updated webhook configuration", "kind", "MutatingWebhookConfiguration", "name", r.Mutating, "url", *want.ClientConfig.URL)
		return nil
	})
}

// Backoff of registerUntilDone (API server down, RBAC missing, ...): from
// registerInitialDelay doubling up to registerMaxDelay, with jitter, and at
// least a 429's Retry-After (internal/backoff).
const (
	registerInitialDelay = 200 * time.Millisecond
	registerMaxDelay     = 30 * time.Second
)

// registerUntilDone calls Register with backoff until it succeeds (true) or
// ctx ends (false). bundle is read at each attempt. Each distinct error is
// logged once.
func (r Registration) registerUntilDone(ctx context.Context, client kubernetes.Interface, bundle func() []byte) bool {
	return r.registerUntilDoneOn(ctx, clock.RealClock{}, client, bundle)
}

// registerUntilDoneOn is registerUntilDone waiting on clk.
func (r Registration) registerUntilDoneOn(ctx context.Context, clk clock.Clock, client kubernetes.Interface, bundle func() []byte) bool {
	logger := klog.FromContext(ctx)
	var failing errlog.Once
	register := func(ctx context.Context) error { return r.Register(ctx, client, bundle()) }
	return backoff.Retry(ctx, clk, registerInitialDelay, registerMaxDelay, register, func(err error, delay time.Duration) {
		failing.Error(logger, err, "Registering the webhook configurations failed; will retry", "backoff", delay)
	})
}
