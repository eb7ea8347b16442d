// Package apitest helps tests that drive Run loops against client-go's fake
// clientset wait until those loops stop talking to the API server, and say
// what kept talking when they never do.
//
// A test that waits for a quiet fake API server must not count its own
// requests: a goroutine of the test that reads through the same clientset
// keeps the count moving, so the wait passes only on a machine slow enough
// to leave gaps between the test's reads (issue 31). Tests read what they
// check through the clientset's object tracker (Get), which records no
// action, and a wait that gives up prints Recent.
package apitest

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clienttesting "k8s.io/client-go/testing"
)

// RecentWindow is how many of the last actions Recent describes by default.
const RecentWindow = 400

// Recent describes the last n actions (all of them if fewer) by verb,
// resource and name, most frequent first, for example
// "last 400 actions: get validatingwebhookconfigurations wh: 400".
func Recent(actions []clienttesting.Action, n int) string {
	if n <= 0 || n > len(actions) {
		n = len(actions)
	}
	if n == 0 {
		return "no actions"
	}
	counts := map[string]int{}
	for _, a := range actions[len(actions)-n:] {
		counts[Key(a)]++
	}
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), strings.Compare(a, b))
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, counts[k])
	}
	return fmt.Sprintf("last %d actions: %s", n, strings.Join(parts, ", "))
}

// Key is an action's verb, resource and, where it has one, the object's
// name: "get secrets ca", "list leases", "watch secrets".
func Key(a clienttesting.Action) string {
	k := a.GetVerb() + " " + a.GetResource().Resource
	if sub := a.GetSubresource(); sub != "" {
		k += "/" + sub
	}
	// Get, delete and patch actions name their object; create and update
	// actions carry it.
	switch a := a.(type) {
	case interface{ GetName() string }:
		k += " " + a.GetName()
	case interface{ GetObject() runtime.Object }:
		if o, ok := a.GetObject().(metav1.Object); ok && o.GetName() != "" {
			k += " " + o.GetName()
		}
	}
	return k
}

// Get reads an object straight from a fake clientset's tracker, so that a
// test's own reads are not actions and never wake a quiescence wait. It
// returns the tracker's error (NotFound included) as is.
func Get[T runtime.Object](tracker clienttesting.ObjectTracker, gvr schema.GroupVersionResource, ns, name string) (T, error) {
	var zero T
	obj, err := tracker.Get(gvr, ns, name)
	if err != nil {
		return zero, err
	}
	t, ok := obj.(T)
	if !ok {
		return zero, fmt.Errorf("%s %s/%s: the tracker holds a %T, not a %T", gvr.Resource, ns, name, obj, zero)
	}
	return t, nil
}
