// Package podcert signs Kubernetes PodCertificateRequests
// (certificates.k8s.io/v1, GA in Kubernetes 1.37) for a signer name of your
// own, with the CA of a authority.Authority, through its CA rotations.
//
// A pod asks for a certificate with a podCertificate projected volume:
//
//	volumes:
//	- name: tls
//	  projected:
//	    sources:
//	    - podCertificate:
//	        signerName: evercert.io/serving
//	        keyType: ECDSAP256
//	        credentialBundlePath: credentialbundle.pem
//
// The kubelet makes the key, creates a PodCertificateRequest carrying the
// public key (spec.stubPKCS10Request) and writes the private key followed by
// the issued chain into credentialbundle.pem; it asks again at the status's
// beginRefreshAt. A Signer decides each request by its Policy (which
// namespaces and service accounts get which DNS names, e.g. the names of
// the Services that select the pod, verified by reading the Pod and the
// Services) and writes exactly one condition: Issued, Denied (with a
// reason the kubelet reports on the pod) or Failed.
//
// Clients trust the Authority's bundle (its CA Secret's ca.crt, or what
// evercert publishes from it), which holds the successor CA before it signs
// anything: a Signer signs only with the Authority's observed signing CA,
// so a CA rotation never hands a pod a certificate its clients cannot
// verify yet.
//
// Replicas of a signer may run side by side, with no leader election: the
// status is written with the resourceVersion it was decided on, so exactly
// one replica's decision is stored, and the others count a conflict.
//
// Metrics (internal/certmetrics): evercert_podcertificate_requests_total
// {signer,result} with result issued, denied, failed or conflict, and the
// histogram evercert_podcertificate_request_duration_seconds{signer,result}
// from a replica first seeing a request to its final status.
//
// RBAC: list and watch on podcertificaterequests, update on
// podcertificaterequests/status, sign on signers with the signer name as
// resourceName (certificates.k8s.io), get on pods and list on services;
// plus the Authority's own (see example/signer/rbac.yaml).
//
// See docs/architecture.md for how the packages fit together.
package podcert
