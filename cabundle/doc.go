// Package cabundle keeps the caBundle fields of Kubernetes objects equal to
// the current bundle of a dynamiccertificates.CAContentProvider, so that the
// API server trusts a webhook or aggregated API server whose serving
// certificate rotates in memory.
//
// # Targets
//
// A [Publisher] writes into any number of [Target]s. Each target names one
// kind and selects objects of that kind either by exact name or by label
// selector:
//
//   - ValidatingWebhookConfiguration and MutatingWebhookConfiguration
//     (admissionregistration.k8s.io/v1): webhooks[*].clientConfig.caBundle,
//     for every webhook of the object or, with [Target.Service], only for the
//     webhooks whose clientConfig.service is that Service.
//   - CustomResourceDefinition (apiextensions.k8s.io/v1):
//     spec.conversion.webhook.clientConfig.caBundle, only while
//     spec.conversion.strategy is Webhook.
//   - APIService (apiregistration.k8s.io/v1): spec.caBundle, only for
//     APIServices that have a spec.service and do not set
//     insecureSkipTLSVerify (the API server rejects that together with a
//     caBundle).
//
// No other field is ever written.
//
// # How it works
//
// The publisher registers itself as a listener of the provider, and runs one
// informer per target (a field selector on metadata.name for a named target,
// the label selector otherwise). A bundle change, any change to a watched
// object, and a periodic resync (default one minute, a safety net) all put the
// target into a rate-limited work queue, which coalesces bursts. Working on a
// target compares every selected field with the bundle in the informer's
// cache and writes only when something differs, so a caBundle that someone
// else overwrote is written back within about a second (drift repair) and an
// object that is already right costs no request.
//
// Writes are, by default, a JSON patch that replaces exactly the caBundle
// fields that differ. For webhook configurations, whose webhooks the patch
// must address by list index, it also carries the resourceVersion that was
// read, as an optimistic-concurrency precondition: if the object changed in
// between, the server answers 409 Conflict, and the target is retried on the
// newer version. With [Config.UseServerSideApply] the publisher instead
// applies, with force, an object that holds nothing but the caBundle fields
// it owns (plus, for webhooks, the webhook name keys), under field manager
// "evercert". Either way, an event that arrives before the informer cache
// has caught up with the publisher's own write does not cause a second one.
//
// Objects that do not exist yet, or that exist but have nothing to inject
// (no matching webhook, conversion strategy None, a local APIService), are
// waited for quietly: this is logged once, and the object is published to as
// soon as the informer sees it change. Failed writes (forbidden, API server
// down, conflict) are retried with exponential backoff, from 100ms up to 30s.
// Each distinct error is logged once, and a conflict only at verbosity 2,
// since it is the expected outcome of a concurrent writer.
//
// # Metrics
//
// Every publish attempt for one object is counted in
// evercert_cabundle_publish_total{kind,result}, with result "success" (the
// object was written), "unchanged" (it already held the bundle, nothing was
// written), "conflict" (the write lost an optimistic-concurrency race) or
// "error" (any other failure).
//
// # RBAC
//
// All four kinds are cluster scoped, so the permissions go into a
// ClusterRole. For each kind it targets, the identity needs the verbs list,
// watch and patch, and nothing on the other kinds:
//
//	rules:
//	- apiGroups: ["admissionregistration.k8s.io"]
//	  resources: ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]
//	  verbs:     ["list", "watch", "patch"]
//	- apiGroups: ["apiextensions.k8s.io"]
//	  resources: ["customresourcedefinitions"]
//	  verbs:     ["list", "watch", "patch"]
//	- apiGroups: ["apiregistration.k8s.io"]
//	  resources: ["apiservices"]
//	  verbs:     ["list", "watch", "patch"]
//
// list and watch feed the informers; patch is the write in both modes (a
// server-side apply is a PATCH request too). get is never used, though
// granting it along with list is customary and harmless. No create, update
// or delete is needed: objects are never created or deleted (a server-side
// apply racing with a deletion fails validation rather than creating a
// stub).
//
// For targets selected by name, all three verbs can be narrowed with
// resourceNames: the informer of a named target lists and watches with the
// field selector metadata.name=<name>, which the API server authorises as a
// request for that resource name. Targets selected by label need list and
// watch on the whole resource.
package cabundle
