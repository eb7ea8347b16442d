package dynamiccert

import (
	corev1 "k8s.io/api/core/v1"
)

// testPod is the object tests' Events are about.
var testPod = &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "ns", Name: "evercert-0"}
