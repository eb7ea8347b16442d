// Package cabundle keeps the caBundle fields of Kubernetes objects equal to
// the current bundle of a dynamiccertificates.CAContentProvider, so that the
// API server trusts a webhook or aggregated API server whose serving
// certificate rotates in memory.
//
// See docs/architecture.md for how the packages fit together.
//
// # Targets
//
// A [Publisher], made by [NewPublisher] from a [PublisherConfig], writes
// into any number of [Target]s. Each target names one kind and selects
// objects of that kind either by exact name or by a label selector with at
// least one requirement (a selector that matches every object of a kind is
// refused: publishing one caBundle into every webhook configuration of a
// cluster is never intended):
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
//   - ClusterTrustBundle (certificates.k8s.io/v1): spec.trustBundle. A
//     named target of this kind owns its object and creates it when it is
//     missing (see [ClusterTrustBundle] for the signer name and RBAC).
//
// No other field is ever written.
//
// # How it works
//
// The publisher registers itself as a listener of the provider, and runs one
// informer per target (a field selector on metadata.name for a named target,
// the label selector otherwise). A bundle change, any change to a watched
// object, and a periodic resync (default one minute, a safety net) all put the
// target into a work queue, which coalesces bursts. Working on a target
// compares every selected field with the bundle in the informer's cache and
// writes only when something differs, so a caBundle that someone else
// overwrote once is written back within about a second (drift repair) and an
// object that is already right costs no request.
//
// Writes are, by default, a JSON patch that replaces exactly the caBundle
// fields that differ. For webhook configurations, whose webhooks the patch
// must address by list index, it also carries the resourceVersion that was
// read, as an optimistic-concurrency precondition: if the object changed in
// between, the server answers 409 Conflict, and the target is retried on the
// newer version. With [PublisherConfig.UseServerSideApply] the publisher instead
// applies an object that holds nothing but the caBundle fields it owns
// (plus, for webhooks, the webhook name keys), under field manager
// "evercert" (see "Server-side apply and force" below). Either way, an event
// that arrives before the informer cache has caught up with the publisher's
// own write does not cause a second one.
//
// Objects that do not exist yet, or that exist but have nothing to inject
// (no matching webhook, conversion strategy None, a local APIService), are
// waited for quietly: this is logged once, and the object is published to as
// soon as the informer sees it change. Failed writes (forbidden, API server
// down, conflict) are retried per target with exponential backoff and
// jitter, from 100ms up to 30s, and never sooner than a Retry-After the
// server sent (a 429, say). Each distinct error is logged once, and a
// conflict only at verbosity 2, since it is the expected outcome of a
// concurrent writer.
//
// # Competing writers (contested caBundles)
//
// Another writer of the same caBundle (a Helm chart that sets it, cainjector,
// OLM, a second publisher with another bundle) would otherwise make the two
// overwrite each other at API latency forever, and break the webhook's TLS at
// every flip. The publisher notices it: a change of a field that held the
// published bundle to anything else is, since the publisher only ever
// writes the published bundle, a write that is not its own (the other writer
// is named from the object's managedFields). Three such changes of one
// object within five minutes make the object contested; one or two (a
// kubectl edit, a Helm upgrade) are drift, repaired at once.
//
// While an object is contested, the publisher writes it at most once per
// backoff delay, however often the other writer changes it: 5s, doubling up
// to a cap of 5 minutes, each delay lengthened by up to half at random. Each
// write gives the other writer a chance to have stopped. The object is clear
// again once the published bundle has held, with no change away from it,
// for 30s or, if longer, for the delay waited before the last write; the
// bookkeeping is then reset and drift is repaired at once again. So next to
// a writer that reacts to every change, the publisher writes about a dozen
// times in the first half hour and then once every 5 to 7.5 minutes. Once
// the other writer stops, the next write sticks, at most one delay later,
// and the object is clear after the longer of 30s and that delay: about 40s
// after a fight of ten seconds, at most 15 minutes after a long one.
//
// A contested object is reported: evercert_cabundle_publish_total with
// result "contested" counts every write held back (and every server-side
// apply conflict); it is logged as an error when it becomes contested, with
// the other writer; [Publisher.HealthCheck] fails while it is, naming it;
// [Publisher.Contested] lists it; and with [PublisherConfig.EventRecorder] a Warning
// Event with reason CABundleContested is sent on the object (and a Normal
// CABundleUncontested when it clears). The fix is to remove the other
// writer: drop caBundle from the chart, the cainjector annotation, or the
// second publisher.
//
// Replicas of one publisher (the same [PublisherConfig.FieldManager]) whose
// sources see a CA rotation step ([A] -> [A B] -> [B]) at slightly
// different times are not other writers of each other. A change to a
// bundle that is a later step of the publisher's own rotation (it shares a
// CA with the published bundle, adds only CAs newer than all of it and
// drops only CAs older than all it keeps), made when the publisher's own
// field manager is the last writer of the object's caBundle in
// managedFields, is not counted, unless it fails to verify a chain served
// now that the publisher's bundle verifies ([PublisherConfig.Verify]: a
// server's leaf still chains to the CA it dropped); and the publisher
// leaves such a bundle alone for up to 10 seconds (on [PublisherConfig.Clock])
// for its own source to catch up, rather than write its older one back.
// After that it writes: a replica whose source is stuck behind is then
// treated like any other writer by the replicas ahead, and named as the
// publisher's own field manager. Another field manager is never excused,
// nor is a bundle of unrelated CAs.
//
// Replicas of one [authority.Authority] know each other's bundles: each
// announces the SHA-256 of the bundle it holds in its signed Lease
// ([authority.Authority.AnnouncesCABundle]). A value that a live replica
// of the source announces, whichever field manager wrote it and whether it
// is a step ahead of or behind this publisher's, is never counted as
// another writer's (unless it fails to verify a chain served now that the
// publisher's bundle verifies); the publisher writes over it only with a
// later step of the rotation, and otherwise leaves it for the replica that
// wrote it to replace when its source moves on (counted with result
// "own_replica", looked at again every 10 seconds). So one Authority's
// replicas never contest each other, however late one of them reads the
// CA Secret, while any other writer still does.
//
// # Server-side apply and force
//
// With [PublisherConfig.UseServerSideApply] the publisher never takes a caBundle over
// from another field manager silently. It applies without force first. A
// field conflict (another manager owns a selected caBundle and holds another
// value) makes the object contested at once: counted as "contested", logged
// and sent as a CABundleContested Event naming the other manager, and the
// write is held back for the first backoff delay (5 to 7.5s). Only after the
// delay does the publisher apply with force, and it logs that and sends a
// Warning Event with reason CABundleForced naming the manager it takes the
// field from; while the object stays contested, each further write is forced
// in the same way, once per delay. A one-off change by another manager (a
// kubectl edit, which owns the field afterwards) is therefore repaired
// after the first delay rather than at once. The one exception is a conflict
// with the publisher's own field manager alone, left by an earlier JSON
// patch (an update, which server-side apply tracks as a distinct manager of
// the same name): that is taken over at once, as no one else is involved.
//
// # Observation
//
// A Publisher is a authority.Observer of the CA rotation of its source:
// [Publisher.Observed] reports whether every selected field of every target
// object holds a CA, as read back from the API server (the informer cache,
// that is after a list or watch returned the object, not when a write
// succeeded), and [Publisher.Pending] names, as "Kind/name", what does not
// yet. Objects that do not exist yet and objects with nothing to inject do
// not block; a target whose informer has not listed its objects yet does.
// Observed reads a cache that the informer event handlers keep (the
// fingerprints of the CAs each object holds), so it costs no API call and
// no parsing. As a dynamiccertificates.Notifier, the publisher notifies its
// listeners whenever what a target holds changes, so that an issuer waiting
// for a successor CA to be observed re-checks at once.
//
// # Health
//
// [Publisher.HealthCheck], named like the publisher (PublisherConfig.Name, default
// "cabundle"), fails while any target has never been published to (its
// object is missing, has nothing to inject, or every write failed so far)
// or any object is contested; its message names each such target or object.
//
// # Clock
//
// [PublisherConfig.Clock] drives the resync ticker, the retry and contested backoffs
// (through the work queue's clock) and the contested window. Tests and the
// fault soak pass a fake clock and step it; the informers' own timers stay on
// the real clock.
//
// # Metrics
//
// Every publish attempt for one object is counted in
// evercert_cabundle_publish_total{kind,result}, with result "success" (the
// object was written), "unchanged" (it already held the bundle, nothing was
// written), "conflict" (the write lost an optimistic-concurrency race),
// "contested" (the object is contested and the write was held back, or a
// server-side apply conflicted with another field manager) or "error" (any
// other failure).
//
// # RBAC
//
// Every kind is cluster scoped, so the permissions go into a ClusterRole.
// For each webhook, CRD or APIService kind it targets, the identity needs
// the verbs list, watch and patch, and nothing on the other kinds
// (ClusterTrustBundle needs more; see [ClusterTrustBundle]):
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
// stub). Events, when a recorder is configured, need create, update and
// patch on events (events.k8s.io) in namespace default, where the Events of
// these cluster-scoped objects go, for the identity the recorder uses.
//
// For targets selected by name, all three verbs can be narrowed with
// resourceNames: the informer of a named target lists and watches with the
// field selector metadata.name=<name>, which the API server authorises as a
// request for that resource name. Targets selected by label need list and
// watch on the whole resource.
package cabundle
