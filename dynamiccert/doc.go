// Package dynamiccert holds the sources of serving certificates and CA
// bundles that load content made elsewhere: static content, files and
// Kubernetes Secrets, and the union of CA bundles. The issuers, which make
// a CA and sign leaves with it (SelfSigned, made and rotated in memory, and
// the Authority, a CA kept in a Secret shared by replicas), are in package
// github.com/evercert/evercert/authority, built on this package's shared
// vocabulary (KeyType, ServedChain, the Event reasons).
//
// Every provider implements the interfaces of
// k8s.io/apiserver/pkg/server/dynamiccertificates (CertKeyContentProvider,
// SNICertKeyContentProvider, CAContentProvider, Notifier and, where it has
// work to do, ControllerRunner), so providers plug into a genericapiserver's
// SecureServingInfo unchanged, and evercert's sni controller accepts
// upstream providers as well.
//
// A provider only ever exposes content that parsed and validated: when new
// content is bad it reports an error naming the source and keeps exposing
// the last good content. Listeners are notified only when the content really
// changed.
//
// A provider parses its content once, and it alone reports it: evercert's
// sni controller serves the parsed certificate (CurrentParsedCertKeyContent)
// and reports nothing for it. Each change of certificate is one Info line at
// the default verbosity (provider, subject, serial, NotAfter, issuer; never
// key material), one update of evercert_certificate_expiration_timestamp_seconds,
// one increment of evercert_certificate_rotations_total (not for the first
// certificate) and, with an EventRecorder, one CertificateRotated Event.
// Each distinct load failure is counted once in
// evercert_certificate_load_errors_total, logged once and sent as one
// CertificateLoadFailed Event: retrying the same content with the same error
// (every file event, every resync, every backoff retry of an API error) is
// one failure; a different error, different content, or the same failure
// after a success is another.
//
// Every config takes the same optional Event sink, EventRecorder
// (k8s.io/client-go/tools/events) and EventObject, the object the Events
// are about; see ReasonCertificateRotated for the reasons.
//
// See docs/architecture.md for how the packages fit together.
//
// # Lifecycle
//
// Every provider has the lifecycle of dynamiccertificates.ControllerRunner,
// like every evercert type that runs: New* validates the config (errors name
// the field) and loads nothing; RunOnce loads once, synchronously, and
// returns what went wrong, naming the source; Run(ctx, workers) keeps the
// content current until ctx is done and returns once its goroutines have
// stopped. A provider has a single loop, so workers is accepted for the
// interface and ignored. RunOnce is optional: Run loads by itself.
package dynamiccert
