// Package controllerruntime adds evercert to a controller-runtime manager in
// one call: [Add] wires the certificate source (an Authority keeping its CA
// in a Secret by default), the caBundle publisher for the webhook
// configurations, CRDs and APIServices that call the webhook, and the sni
// controller that serves the rotating leaf, as manager Runnables that run on
// every replica, and sets the manager's webhook server to serve the leaf.
//
// It is a separate Go module (github.com/evercert/evercert/controllerruntime)
// so that the core module takes no controller-runtime dependency. See
// docs/architecture.md for how the packages fit together.
package controllerruntime
