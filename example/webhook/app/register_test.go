package app

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

func writes(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		if a.GetVerb() != "get" {
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	return out
}

func TestRegisterCreatesThenIsIdempotent(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	reg := Registration{BaseURL: "https://127.0.0.1:8443", Validating: "v", Mutating: "m"}
	require.NoError(t, reg.Register(ctx, client, []byte("bundle-1")))
	assert.Equal(t, []string{"create validatingwebhookconfigurations", "create mutatingwebhookconfigurations"}, writes(client))

	v, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "v", metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, v.Webhooks, 1)
	h := v.Webhooks[0]
	assert.Equal(t, ValidatingWebhookName, h.Name)
	assert.Equal(t, "https://127.0.0.1:8443/validate", *h.ClientConfig.URL)
	assert.Equal(t, []byte("bundle-1"), h.ClientConfig.CABundle)
	assert.Equal(t, admissionregistrationv1.Fail, *h.FailurePolicy)
	assert.Equal(t, admissionregistrationv1.SideEffectClassNone, *h.SideEffects)
	assert.Equal(t, []string{"v1"}, h.AdmissionReviewVersions)
	assert.Equal(t, int32(5), *h.TimeoutSeconds)
	assert.Equal(t, map[string]string{EnabledNamespaceLabel: EnabledNamespaceValue}, h.NamespaceSelector.MatchLabels)
	require.Len(t, h.Rules, 1)
	assert.Equal(t, []string{"configmaps"}, h.Rules[0].Resources)
	assert.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, h.Rules[0].Operations)
	assert.Equal(t, ManagedByValue, v.Labels[ManagedByLabel])

	m, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "m", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "https://127.0.0.1:8443/mutate", *m.Webhooks[0].ClientConfig.URL)
	assert.Equal(t, MutatingWebhookName, m.Webhooks[0].Name)

	// Already right: nothing is written.
	client.ClearActions()
	require.NoError(t, reg.Register(ctx, client, []byte("bundle-1")))
	assert.Empty(t, writes(client))

	// An empty bundle keeps the published one.
	require.NoError(t, reg.Register(ctx, client, nil))
	assert.Empty(t, writes(client))
}

func TestRegisterUpdatesKeepingServerDefaults(t *testing.T) {
	ctx := context.Background()
	existing := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "v", Labels: map[string]string{"team": "x"}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{
				Name:         ValidatingWebhookName,
				ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://old:1/validate"), CABundle: []byte("old")},
				MatchPolicy:  ptr.To(admissionregistrationv1.Equivalent),
			},
			{Name: "stale.webhook.evercert.io"},
		},
	}
	client := fake.NewClientset(existing)
	reg := Registration{BaseURL: "https://127.0.0.1:9443", Validating: "v", Namespace: "team"}
	require.NoError(t, reg.Register(ctx, client, nil))
	v, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "v", metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, v.Webhooks, 1, "only this app's webhook is kept")
	h := v.Webhooks[0]
	assert.Equal(t, "https://127.0.0.1:9443/validate", *h.ClientConfig.URL)
	assert.Equal(t, []byte("old"), h.ClientConfig.CABundle, "empty bundle keeps the existing one")
	assert.Equal(t, admissionregistrationv1.Equivalent, *h.MatchPolicy, "server default kept")
	assert.Equal(t, map[string]string{"kubernetes.io/metadata.name": "team"}, h.NamespaceSelector.MatchLabels)
	assert.Equal(t, map[string]string{"team": "x", ManagedByLabel: ManagedByValue}, v.Labels)
}

func TestRegisterRetriesConflicts(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	conflicts := 2
	client.PrependReactor("create", "mutatingwebhookconfigurations", func(clienttesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			// A concurrent replica created it first.
			return true, nil, apierrors.NewAlreadyExists(admissionregistrationv1.Resource("mutatingwebhookconfigurations"), "m")
		}
		return false, nil, nil
	})
	reg := Registration{BaseURL: "https://127.0.0.1:9443", Mutating: "m"}
	require.NoError(t, reg.Register(ctx, client, []byte("b")))
	assert.Zero(t, conflicts)
	_, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "m", metav1.GetOptions{})
	require.NoError(t, err)
}
