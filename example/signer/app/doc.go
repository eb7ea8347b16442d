// Package app wires evercert's example PodCertificateRequest signer.
//
// The signer signs the PodCertificateRequests addressed to --signer-name
// (default evercert.io/serving), which kubelets create for pods with a
// podCertificate projected volume, by the policy in --policy (a YAML
// podcert.Policy). Its CA lives in a Secret (--ca-secret namespace/name,
// with --kubeconfig), shared by every replica and rotated with observation
// (authority.Authority): replicas run side by side without leader
// election. Clients of the pods trust the CA Secret's ca.crt, or the
// bundle written to --ca-bundle-file.
//
// The signer also serves HTTPS (its own leaf, for --self-signed-hosts,
// from the same CA) with /metrics, /livez, /readyz and /healthz; /readyz
// waits until the requests are listed and the CA is loaded.
//
// RBAC is in example/signer/rbac.yaml, a policy example in
// example/signer/policy.yaml.
//
// See docs/architecture.md for how the packages fit together.
package app
