package sampleapiserver

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/compatibility"
	certutil "k8s.io/client-go/util/cert"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorfake "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset/fake"

	"github.com/evercert/evercert/loopback"
)

// TestPublishServingCA: with Options.APIService the sample keeps the
// APIService's caBundle equal to the in-memory serving CA bundle that
// loopback.ApplyRecommendedOptions made (there is no apiserver.crt to copy
// any more): the generic server runs the publisher from its post-start
// hook, the APIService (on a fake clientset) gets the bundle, and the
// publisher's readiness check is on /readyz. A serving certificate without
// a CA bundle is refused, not ignored.
func TestPublishServingCA(t *testing.T) {
	const name = "v1alpha1.sample.evercert.io"
	ro := genericoptions.NewRecommendedOptions(DefaultEtcdPathPrefix, nil)
	ro.Etcd, ro.CoreAPI, ro.Admission = nil, nil, nil
	ro.Features.EnablePriorityAndFairness = false
	ro.Authentication.RemoteKubeConfigFileOptional = true
	ro.Authorization.RemoteKubeConfigFileOptional = true
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ro.SecureServing.Listener = ln
	gc := genericapiserver.NewRecommendedConfig(Codecs)
	gc.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	applied, err := loopback.ApplyRecommendedOptions(ro, gc, loopback.ApplyConfig{})
	require.NoError(t, err)

	client := aggregatorfake.NewClientset(&apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: apiregistrationv1.APIServiceSpec{Group: GroupName, Version: "v1alpha1",
			Service: &apiregistrationv1.ServiceReference{Namespace: "sample", Name: "api"}},
	})
	c := &Config{GenericConfig: gc, Applied: applied}
	require.NoError(t, c.publishServingCA(name, client))
	require.NotNil(t, c.Publisher)
	serving := applied.Serving.(dynamiccertificates.CAContentProvider)

	gs, err := gc.Complete().New("publish-test", genericapiserver.NewEmptyDelegate())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gs.PrepareRun().RunWithContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Error("server did not stop within 60s")
		}
	})
	require.Eventually(t, func() bool {
		got, err := client.ApiregistrationV1().APIServices().Get(ctx, name, metav1.GetOptions{})
		return err == nil && len(got.Spec.CABundle) > 0 && bytes.Equal(got.Spec.CABundle, serving.CurrentCABundleContent())
	}, 60*time.Second, 10*time.Millisecond, "the APIService's caBundle is the in-memory serving CA bundle")
	require.Eventually(t, c.Publisher.HasSynced, 60*time.Second, 10*time.Millisecond)
	names := map[string]bool{}
	for _, check := range gc.ReadyzChecks {
		names[check.Name()] = true
	}
	assert.True(t, names["apiservice-ca-bundle"], "the publisher's check is a readiness check: %v", names)

	// A serving certificate without a CA bundle cannot be published.
	noCA := &Config{GenericConfig: genericapiserver.NewRecommendedConfig(Codecs), Applied: &loopback.Applied{Serving: staticServing(t)}}
	err = noCA.publishServingCA(name, client)
	assert.ErrorContains(t, err, "has no CA bundle to publish")
}

// staticServing is a serving certificate without a CA bundle, as upstream's
// for --tls-cert-file.
func staticServing(t *testing.T) dynamiccertificates.CertKeyContentProvider {
	t.Helper()
	cert, key, err := certutil.GenerateSelfSignedCertKey("localhost", nil, nil)
	require.NoError(t, err)
	p, err := dynamiccertificates.NewStaticCertKeyContent("static", cert, key)
	require.NoError(t, err)
	return p
}
