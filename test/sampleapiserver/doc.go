// Package sampleapiserver is an aggregated API server shaped like
// k8s.io/sample-apiserver, wired with loopback.ApplyRecommendedOptions
// instead of RecommendedOptions.ApplyTo. It exists to prove, in
// TestE2ESampleAPIServer (test/e2e), that such a server keeps working while
// its loopback and serving certificates rotate.
//
// Like sample-apiserver it has:
//
//   - upstream's RecommendedOptions: etcd storage, delegated authentication
//     and authorization, CoreAPI, admission, features;
//   - a storage-backed API group, sample.evercert.io/v1alpha1, with one
//     namespaced resource, flunders (a Flunder's spec.reference may name
//     another Flunder of the same namespace);
//   - an admission plugin, RequireReference, whose informer is built in
//     RecommendedOptions.ExtraAdmissionInitializers from the server's
//     loopback client config: it rejects a Flunder whose spec.reference is
//     not in that informer's cache. So a create that names a just-created
//     Flunder succeeds only if the informer, talking to the server through
//     the loopback client, keeps up.
//
// The serving certificate and the loopback certificate come from
// Options.Serving (see loopback.ApplyConfig): both rotate in memory
// while the server runs, and the loopback client config every informer and
// client above was built from follows every rotation.
package sampleapiserver
