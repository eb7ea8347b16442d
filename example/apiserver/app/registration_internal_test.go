package app

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorfake "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset/fake"

	"github.com/evercert/evercert/authority"
)

func TestRegistrationEnsure(t *testing.T) {
	ctx := context.Background()
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: "serving"})
	require.NoError(t, err)
	bundle := serving.CurrentCABundleContent()
	newReg := func(objects ...*apiregistrationv1.APIService) (*registration, *aggregatorfake.Clientset) {
		var objs []runtime.Object
		for _, o := range objects {
			objs = append(objs, o)
		}
		client := aggregatorfake.NewClientset(objs...)
		return &registration{client: client, namespace: "ns", name: "svc", port: 443, source: serving}, client
	}
	get := func(client *aggregatorfake.Clientset) *apiregistrationv1.APIService {
		got, err := client.ApiregistrationV1().APIServices().Get(ctx, APIServiceName, metav1.GetOptions{})
		require.NoError(t, err)
		return got
	}
	writes := func(client *aggregatorfake.Clientset) (n int) {
		for _, a := range client.Actions() {
			if a.GetVerb() == "create" || a.GetVerb() == "update" {
				n++
			}
		}
		return n
	}

	t.Run("creates", func(t *testing.T) {
		r, client := newReg()
		require.NoError(t, r.ensure(ctx))
		got := get(client)
		assert.Equal(t, DesiredAPIService("ns", "svc", 443, bundle).Spec, got.Spec)
		assert.Equal(t, "certificates.evercert.io", got.Spec.Group)
		assert.Equal(t, "v1alpha1", got.Spec.Version)
		assert.EqualValues(t, 1000, got.Spec.GroupPriorityMinimum)
		assert.EqualValues(t, 15, got.Spec.VersionPriority)
		assert.False(t, got.Spec.InsecureSkipTLSVerify)
		assert.Equal(t, bundle, got.Spec.CABundle)

		require.NoError(t, r.ensure(ctx))
		assert.Equal(t, 1, writes(client), "nothing to do the second time")
	})

	t.Run("repairs the spec but leaves a stale caBundle to the publisher", func(t *testing.T) {
		wrong := DesiredAPIService("other", "svc", 8443, []byte("stale"))
		wrong.Spec.VersionPriority = 1
		r, client := newReg(wrong)
		require.NoError(t, r.ensure(ctx))
		got := get(client)
		assert.Equal(t, "ns", got.Spec.Service.Namespace)
		assert.EqualValues(t, 443, *got.Spec.Service.Port)
		assert.EqualValues(t, 15, got.Spec.VersionPriority)
		assert.Equal(t, []byte("stale"), got.Spec.CABundle)
	})

	t.Run("replaces insecureSkipTLSVerify by the caBundle", func(t *testing.T) {
		insecure := DesiredAPIService("ns", "svc", 443, nil)
		insecure.Spec.InsecureSkipTLSVerify = true
		r, client := newReg(insecure)
		require.NoError(t, r.ensure(ctx))
		got := get(client)
		assert.False(t, got.Spec.InsecureSkipTLSVerify)
		assert.Equal(t, bundle, got.Spec.CABundle)
	})

	t.Run("errors carry context", func(t *testing.T) {
		r, client := newReg()
		client.PrependReactor("create", "apiservices", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, assert.AnError
		})
		assert.ErrorContains(t, r.ensure(ctx), "creating APIService v1alpha1.certificates.evercert.io")
	})
}
