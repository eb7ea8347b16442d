// Package dynamiccert holds the sources of serving certificates and CA
// bundles: static content, files, self-signed certificates made and rotated
// in memory, Kubernetes Secrets, and a CA authority kept in a Secret.
//
// Every provider implements the interfaces of
// k8s.io/apiserver/pkg/server/dynamiccertificates (CertKeyContentProvider,
// SNICertKeyContentProvider, CAContentProvider, Notifier and, where it has
// work to do, ControllerRunner), so providers plug into a genericapiserver's
// SecureServingInfo unchanged, and evercert's sni controller accepts
// upstream providers as well.
//
// A provider only ever exposes content that parsed and validated: when new
// content is bad it reports an error naming the source, counts it in
// evercert_certificate_load_errors_total, and keeps exposing the last good
// content. Listeners are notified only when the content really changed.
package dynamiccert
