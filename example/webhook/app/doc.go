// Package app wires evercert's example admission webhook.
//
// The webhook enforces a small rule on ConfigMaps in the namespaces labelled
// evercert.io/webhook=enabled (or in the one namespace given by
// --target-namespace): the validating webhook (ValidatePath) denies a
// ConfigMap without the label "app", and the mutating webhook (MutatePath)
// adds the annotation evercert.io/defaulted=true when it is missing. Only
// admission.k8s.io/v1 AdmissionReviews are handled.
//
// Certificates come from an Authority (--ca-secret namespace/name, with
// --kubeconfig): a CA kept in a Secret shared by every replica, and a leaf
// for --self-signed-hosts made in memory by each replica. A cabundle
// Publisher keeps the caBundle of the configurations named by
// --validating-webhook-configuration and --mutating-webhook-configuration
// equal to the CA bundle, through every CA rotation; /readyz fails until it
// has published once. With --register-url the webhook also creates or
// updates those configurations itself, pointing them at that URL, which is
// handy for local demos and tests.
//
// RBAC is in example/webhook/rbac.yaml.
//
// See docs/architecture.md for how the packages fit together.
package app
