// Package certreporttest reads back the Events evercert sent in tests.
package certreporttest

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
)

// Pod is an object for tests' Events to be about.
var Pod = &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "ns", Name: "evercert-0"}

// NewRecorder returns a FakeRecorder that keeps up to 100 Events, each as
// "<type> <reason> <action> <note> {kind=<kind>,apiVersion=<version>}" of the
// object it is about.
func NewRecorder() *events.FakeRecorder {
	r := events.NewFakeRecorder(100)
	r.Verbose = true
	return r
}

// Drain returns the Events r holds, oldest first, and empties it.
func Drain(r *events.FakeRecorder) []string {
	var out []string
	for len(r.Events) > 0 {
		out = append(out, <-r.Events)
	}
	return out
}
