// Package authority holds the issuers: SelfSigned, which makes a CA and
// rotates it in memory, and the Authority, which keeps a CA in a
// Kubernetes Secret shared by replicas (Leases, announcements, clock skew,
// emergencies, key sources, adoption of other rotators' Secrets). Both make
// a CA and sign this process's serving leaf with it.
//
// They are providers like those of package
// github.com/evercert/evercert/dynamiccert: they implement the same
// k8s.io/apiserver/pkg/server/dynamiccertificates interfaces, report their
// content and failures the same way (logs, metrics, Events with
// dynamiccert's reasons) and have the same lifecycle (see dynamiccert's
// Lifecycle). CAs that they make are named "<Name>-ca@<unix seconds>", as
// upstream names its self-signed CAs, so that logs, Status and x509 errors
// say which CA.
//
// The issuers (SelfSigned, Authority) can make one leaf per
// dynamiccert.KeyType for the same names (KeyTypes, e.g. ECDSAP256 and
// RSA2048), signed by one CA and
// renewed together: the first is the provider's own content, the others
// are served by its Alternatives, which the sni controller serves side by
// side, giving each client the first it supports, ECDSA first.
//
// See docs/architecture.md for how the packages fit together.
//
// # Observed rotation
//
// SelfSigned and Authority are issuers: they make a CA and sign this
// process's serving leaf with it. They share one schedule and one Run loop,
// and differ only in where the CA state lives (memory, or a Secret shared by
// replicas) and in whether replicas coordinate. A CA rotation has three
// phases, and a CA never signs a leaf before it has been seen:
//
//  1. Publish. CARenewBefore ahead of the signing CA's expiry, a successor
//     CA joins every bundle the issuer publishes: its CAContentProvider
//     (and so the caBundle targets and the bundle file fed from it) and,
//     for an Authority, the Secret's ca.crt.
//  2. Observe. The successor signs only once PropagationDelay (the minimum
//     delay, for consumers evercert cannot see) has passed since this
//     process first saw it and every observer (below) confirmed it.
//  3. Retire. The old CA stays in every bundle until it expires.
//
// The observers a successor waits for are:
//
//   - each Observer (AddObserver): a cabundle.Publisher confirms when
//     every target, read back from the API server, holds the successor;
//     the server package's --ca-bundle-file writer confirms once the
//     file holds it;
//   - for an Authority, every live replica: each replica announces in a
//     coordination.k8s.io/v1 Lease (label evercert.io/authority=<Secret
//     name>) the fingerprints of the CAs it has loaded and its own
//     observers confirmed (a successor only once the minimum delay has
//     passed since that replica first saw it, so a replica that saw it
//     late gives its own consumers the full delay too), the hash of its
//     bundle and its leaf serial. A replica whose Lease has not been seen
//     renewed for its lease duration is not waited for. Liveness is judged
//     by when a renewal was seen on the observer's clock, never by the
//     writer's timestamps, and time the observer itself was paused does
//     not count. A Lease not renewed for ten lease durations is deleted by
//     the replicas that remain. Announcements are signed with the key of
//     the leaf the replica serves (SignatureAnnotation); one that
//     is unsigned, forged (a bad signature, or a leaf that does not chain
//     to a CA in the Secret), replayed (older than the last believed) or
//     garbled is ignored, counted and logged once, so writing Leases is not
//     enough to confirm a successor or to hold one back for ever.
//
// Status reports the phase: the signing CA, the Successor with the time it
// was published, when its minimum delay ends and the observers still
// Pending, and whether the rotation is Stalled (the signing CA is within
// the leaf renew-before of its expiry and no successor signs: one still
// waits for observers, or none could be published because the CA state
// cannot be read or written).
// RotationCheck turns that into a readiness check, and
// evercert_ca_rotation_pending_observers{provider} counts the pending
// observers.
//
// After a pause (a suspended VM, every replica down) the observed CA keeps
// signing while it is valid, and its leaves are capped at its NotAfter; the
// successor is published at wake-up and observed as usual. When the signing
// CA is no longer valid there is no choice left: the published successor
// signs if it is still valid, or else a fresh CA. That is an unsafe rotation
// when clients cannot have it: a fresh CA, or a successor whose minimum
// delay has not passed on this process or that this process's own
// observers do not hold (other replicas' announcements are not asked: after
// a pause they are stale until renewed). After an unsafe rotation, clients
// that did not refresh their trust fail until they do. It is counted in
// Status().UnsafeRotations and
// evercert_unsafe_rotations_total{provider}, logged at error level, and sent
// as a Warning Event (ReasonUnsafeCARotation) when an EventRecorder is
// configured. An Authority also records it in the CA Secret
// (UnsafeRotationsAnnotation) with the write that lets the CA sign, so every
// replica reports it in Status().RecordedUnsafeRotations and
// evercert_unsafe_rotations_recorded{provider}.
//
// Clock skew: replicas and clients may disagree by up to SkewTolerance
// (default one hour, less for short lifetimes). Certificates are backdated
// by it; a CA that is not yet valid by less than it is accepted; and each
// replica measures the minimum delay from when it first saw the successor,
// on its own clock, so a replica whose clock is ahead cannot cut it short.
// Beyond the tolerance the Authority's own clock is the suspect: a CA in
// the Secret that is not yet valid here is never replaced or written over,
// a replica whose clock disagrees with most live peers' Lease renewals
// writes nothing and fails its readiness naming the skew, and an expired
// signing CA is replaced only when most live replicas see it expired too
// (see Authority and docs/architecture.md).
//
// Faults: every failed check is retried with exponential backoff, jitter
// and a cap (internal/backoff), at least as long as a 429's Retry-After; a
// write conflict means re-read and decide again. While the CA state cannot
// be read or written (an API outage, RBAC, content it will not overwrite),
// the issuer keeps renewing its own leaf from the signing CA it holds. An
// Authority that finds its Secret deleted, or rolled back to older content
// (a signing CA older than its own that it knew, or that is no longer
// valid), writes back the CAs it knows instead of starting a CA no client
// trusts; a valid CA it never saw is another writer's, not a rollback. To
// force a new CA, annotate the Secret (below).
//
// # Operator requests and emergency rotation
//
// An operator acts on an Authority through annotations on its CA Secret
// (operator_annotations.go; the evercert CLI or kubectl annotate sets
// them). RotateRequestedAnnotation starts an observed rotation now: a
// successor is published at once, and signs as on schedule.
// CompromisedCAAnnotation, the Fingerprint of a CA in the Secret (signing,
// successor, or an older CA still in ca.crt), starts an emergency rotation:
// a successor is published at once (a compromised successor is dropped and
// replaced), it signs as soon as every Observer and every live replica
// confirms it, without the minimum propagation delay, every replica
// re-issues its leaf from it, SignLeaf (and so the podcert signer) refuses
// the compromised CA from the moment the replica read the mark, and the
// compromised CA leaves ca.crt, and with it every caBundle, trust bundle
// and bundle file that follows the Authority, as soon as no live replica's
// Lease announces a leaf it signed, not at its expiry.
// CompromisedHandledAnnotation then records it. Skipping the minimum delay
// is the right trade here: it stands for consumers evercert cannot
// observe, and in an emergency a key that an attacker may hold must stop
// being trusted sooner than such a consumer is likely to cause an outage;
// every consumer evercert observes is still waited for, so the clients that
// follow a published bundle never fail. A fingerprint that matches no CA
// is reported (a Warning Event, evercert_operator_requests_total) and
// ignored. Each step is a Warning EmergencyCARotation Event on the Secret,
// counted in evercert_emergency_rotation_steps_total, and shown in
// Status().Emergency.
package authority
