package cabundle

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// enforceResourceVersions makes the fake clientset behave like the API
// server for resource (e.g. "mutatingwebhookconfigurations"): every create,
// update and JSON patch stores the object with a new resourceVersion, and an
// update or JSON patch that names a resourceVersion other than the stored
// one fails with 409 Conflict. The plain fake tracker never changes an
// object's resourceVersion, which hides every race that the publisher's
// preconditions and its write bookkeeping (writes.cacheBehind) exist for.
// newObj returns an empty object of the resource's type.
func enforceResourceVersions(t testing.TB, c *kubefake.Clientset, resource string, newObj func() k8sruntime.Object) {
	t.Helper()
	var mu sync.Mutex // one write at a time, as etcd's compare-and-swap
	next := 100
	bump := func(o k8sruntime.Object) error {
		m, err := meta.Accessor(o)
		if err != nil {
			return err
		}
		next++
		m.SetResourceVersion(strconv.Itoa(next))
		return nil
	}
	tracker := c.Tracker()
	c.PrependReactor("create", resource, func(a clienttesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		ca := a.(clienttesting.CreateActionImpl)
		o := ca.GetObject().DeepCopyObject()
		if err := bump(o); err != nil {
			return true, nil, err
		}
		if err := tracker.Create(a.GetResource(), o, "", ca.CreateOptions); err != nil {
			return true, nil, err
		}
		return true, o, nil
	})
	stored := func(a clienttesting.Action, name string) (k8sruntime.Object, string, error) {
		cur, err := tracker.Get(a.GetResource(), "", name)
		if err != nil {
			return nil, "", err
		}
		m, err := meta.Accessor(cur)
		if err != nil {
			return nil, "", err
		}
		return cur, m.GetResourceVersion(), nil
	}
	conflict := func(a clienttesting.Action, name, got, want string) error {
		return apierrors.NewConflict(a.GetResource().GroupResource(), name,
			fmt.Errorf("the object has been modified: resourceVersion %s, stored %s", got, want))
	}
	c.PrependReactor("update", resource, func(a clienttesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		ua := a.(clienttesting.UpdateActionImpl)
		o := ua.GetObject().DeepCopyObject()
		m, err := meta.Accessor(o)
		if err != nil {
			return true, nil, err
		}
		_, rv, err := stored(a, m.GetName())
		if err != nil {
			return true, nil, err
		}
		if m.GetResourceVersion() != "" && m.GetResourceVersion() != rv {
			return true, nil, conflict(a, m.GetName(), m.GetResourceVersion(), rv)
		}
		if err := bump(o); err != nil {
			return true, nil, err
		}
		if err := tracker.Update(a.GetResource(), o, "", ua.UpdateOptions); err != nil {
			return true, nil, err
		}
		return true, o, nil
	})
	c.PrependReactor("patch", resource, func(a clienttesting.Action) (bool, k8sruntime.Object, error) {
		pa := a.(clienttesting.PatchActionImpl)
		if pa.GetPatchType() != types.JSONPatchType {
			return false, nil, nil // server-side apply: the fake's own handling
		}
		mu.Lock()
		defer mu.Unlock()
		cur, rv, err := stored(a, pa.GetName())
		if err != nil {
			return true, nil, err
		}
		doc, err := json.Marshal(cur)
		if err != nil {
			return true, nil, err
		}
		patch, err := jsonpatch.DecodePatch(pa.GetPatch())
		if err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		patched, err := patch.Apply(doc)
		if err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		o := newObj()
		if err := json.Unmarshal(patched, o); err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		m, err := meta.Accessor(o)
		if err != nil {
			return true, nil, err
		}
		if m.GetResourceVersion() != rv {
			// The patch replaced the resourceVersion: a precondition.
			return true, nil, conflict(a, pa.GetName(), m.GetResourceVersion(), rv)
		}
		if err := bump(o); err != nil {
			return true, nil, err
		}
		if err := tracker.Patch(a.GetResource(), o, "", metav1.PatchOptions{FieldManager: pa.PatchOptions.FieldManager}); err != nil {
			return true, nil, err
		}
		return true, o, nil
	})
}
