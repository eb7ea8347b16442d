package cabundle

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	admissionregistrationinformers "k8s.io/client-go/informers/admissionregistration/v1"
	"k8s.io/client-go/kubernetes"
)

// ValidatingWebhookConfiguration is an admissionregistration.k8s.io/v1
// ValidatingWebhookConfiguration; the field is
// webhooks[*].clientConfig.caBundle. Its client is
// PublisherConfig.KubeClient.
const ValidatingWebhookConfiguration Kind = "ValidatingWebhookConfiguration"

func init() {
	registerKind(ValidatingWebhookConfiguration, withClient((*clients).kube, validatingWebhookAdapter))
}

func validatingWebhookAdapter(client kubernetes.Interface) *kindAdapter {
	type o = admissionregistrationv1.ValidatingWebhookConfiguration
	return webhookKind[o, *o, admissionregistrationv1.ValidatingWebhook]{
		kind:        ValidatingWebhookConfiguration,
		newInformer: informerOf(admissionregistrationinformers.NewFilteredValidatingWebhookConfigurationInformer, client),
		client:      client.AdmissionregistrationV1().ValidatingWebhookConfigurations(),
		webhooks:    func(c *o) []admissionregistrationv1.ValidatingWebhook { return c.Webhooks },
		webhook: func(w admissionregistrationv1.ValidatingWebhook) (string, admissionregistrationv1.WebhookClientConfig) {
			return w.Name, w.ClientConfig
		},
	}.adapter()
}
