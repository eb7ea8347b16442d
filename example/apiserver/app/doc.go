// Package app wires the example genericapiserver: secure serving on
// 127.0.0.1 with an in-memory self-signed serving certificate (or the given
// files), evercert's rotating loopback certificate and loopback client
// (loopback.ApplyToConfig), and a post-start hook that calls the server
// through a clientset built once from the loopback config, counting
// evercert_loopback_selfcheck_total. There is no etcd.
//
// See docs/architecture.md for how the packages fit together.
//
// # API
//
// Besides /healthz, /livez, /readyz, /version, /metrics and discovery, the
// server serves the read-only group certificates.evercert.io/v1alpha1 (types
// in package apis/certificates/v1alpha1): the cluster-scoped resource
// servingcertificates lists, with verbs get and list, every certificate the
// server currently serves (the default serving certificate, SNI
// certificates, the loopback certificate), one item per provider, read from
// the server's own SecureServingInfo at each request. It is served by plain
// handlers rather than a storage-backed InstallAPIGroup (which would need
// OpenAPI definitions for the types), and is listed in both the legacy and
// the aggregated /apis discovery documents. Requests pass the normal
// authentication and authorization filters as resource requests (list or
// get on servingcertificates.certificates.evercert.io), so RBAC applies to
// them as to any resource. Only JSON and YAML are offered.
//
// # Standalone and aggregated
//
// Without --kubeconfig the server stands alone: anonymous requests may read
// PublicPaths, system:masters may do anything, and the loopback token is
// system:apiserver in system:masters.
//
// With --kubeconfig it is an aggregated API server. Authentication and
// authorization are delegated to that kube-apiserver as upstream's
// DelegatingAuthenticationOptions and DelegatingAuthorizationOptions do
// (TokenReview, SubjectAccessReview, the request-header and client CAs from
// the kube-system/extension-apiserver-authentication ConfigMap unless
// --requestheader-client-ca-file or --client-ca-file are given); the
// loopback token keeps working. With --apiservice-service namespace/name as
// well, a post-start hook creates or updates the APIService
// v1alpha1.certificates.evercert.io (that Service and --apiservice-port,
// groupPriorityMinimum 1000, versionPriority 15, caBundle, never
// insecureSkipTLSVerify) and then runs a cabundle.Publisher that keeps its
// caBundle equal to the serving CA bundle through every CA rotation and
// writes back a caBundle someone else changed. The self-signed serving
// certificate is then also made for <name>.<namespace>.svc, the name the
// aggregator verifies. The Service and its endpoints are the deployer's job.
//
// The identity of --kubeconfig needs what any aggregated API server needs
// (a ClusterRoleBinding to system:auth-delegator and, in kube-system, a
// RoleBinding to extension-apiserver-authentication-reader) plus, to
// register: get, update, list, watch and patch on the APIService
// v1alpha1.certificates.evercert.io (resourceNames may be used) and create
// on apiservices.
//
// The package main next to it only parses flags and calls Run; tests build
// servers through NewServer.
package app
