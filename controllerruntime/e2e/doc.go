// Package e2e runs the sample operator (controllerruntime/example/operator)
// as three replicas, separate processes, against a real kube-apiserver and
// etcd, through CA rotations. The tests have the build tag e2e; run them
// with make test-operator-e2e. See docs/architecture.md.
package e2e
