package cabundle

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	admissionregistrationinformers "k8s.io/client-go/informers/admissionregistration/v1"
	"k8s.io/client-go/kubernetes"
)

// MutatingWebhookConfiguration is an admissionregistration.k8s.io/v1
// MutatingWebhookConfiguration; the field is
// webhooks[*].clientConfig.caBundle. Its client is
// PublisherConfig.KubeClient.
const MutatingWebhookConfiguration Kind = "MutatingWebhookConfiguration"

func init() {
	registerKind(MutatingWebhookConfiguration, withClient((*clients).kube, mutatingWebhookAdapter))
}

func mutatingWebhookAdapter(client kubernetes.Interface) *kindAdapter {
	type o = admissionregistrationv1.MutatingWebhookConfiguration
	return webhookKind[o, *o, admissionregistrationv1.MutatingWebhook]{
		kind:        MutatingWebhookConfiguration,
		newInformer: informerOf(admissionregistrationinformers.NewFilteredMutatingWebhookConfigurationInformer, client),
		client:      client.AdmissionregistrationV1().MutatingWebhookConfigurations(),
		webhooks:    func(c *o) []admissionregistrationv1.MutatingWebhook { return c.Webhooks },
		webhook: func(w admissionregistrationv1.MutatingWebhook) (string, admissionregistrationv1.WebhookClientConfig) {
			return w.Name, w.ClientConfig
		},
	}.adapter()
}
