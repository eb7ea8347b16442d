// Package v1alpha1 holds the types of the read-only API group
// certificates.evercert.io/v1alpha1 that the example aggregated API server
// serves: one cluster-scoped resource, servingcertificates, listing the
// certificates the server currently presents to TLS clients, one item per
// certificate provider (metadata.name is the provider name).
//
// The types are plain Go structs with hand-written deep copies; there is no
// storage, no internal version and no conversion. The server encodes them as
// JSON or YAML only.
//
// See docs/architecture.md for how the packages fit together.
package v1alpha1
