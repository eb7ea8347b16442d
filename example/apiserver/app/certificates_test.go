package app_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	certv1alpha1 "github.com/evercert/evercert/example/apiserver/apis/certificates/v1alpha1"
	"github.com/evercert/evercert/example/apiserver/app"
	"github.com/evercert/evercert/loopback"
)

// getServingCertificates lists through rc and decodes the JSON.
func getServingCertificates(t *testing.T, rc rest.Interface) certv1alpha1.ServingCertificateList {
	t.Helper()
	b, err := rc.Get().AbsPath(app.ServingCertificatesPath).DoRaw(context.Background())
	require.NoError(t, err)
	var list certv1alpha1.ServingCertificateList
	require.NoError(t, json.Unmarshal(b, &list))
	return list
}

func itemByName(list certv1alpha1.ServingCertificateList, name string) (certv1alpha1.ServingCertificate, bool) {
	for _, it := range list.Items {
		if it.Name == name {
			return it, true
		}
	}
	return certv1alpha1.ServingCertificate{}, false
}

func TestServingCertificatesAPI(t *testing.T) {
	o := app.NewOptions()
	o.SelfcheckInterval = 0
	s := startServer(t, o, nil)
	cfg := s.GenericAPIServer.LoopbackClientConfig
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	rc := cs.Discovery().RESTClient()
	ctx := context.Background()

	t.Run("list describes what is served", func(t *testing.T) {
		b, err := rc.Get().AbsPath(app.ServingCertificatesPath).DoRaw(ctx)
		require.NoError(t, err)
		var meta metav1.TypeMeta
		require.NoError(t, json.Unmarshal(b, &meta))
		assert.Equal(t, "certificates.evercert.io/v1alpha1", meta.APIVersion)
		assert.Equal(t, "ServingCertificateList", meta.Kind)

		list := getServingCertificates(t, rc)
		require.Len(t, list.Items, 2, "serving and loopback")
		assert.Equal(t, "serving", list.Items[0].Name, "the default serving certificate comes first")

		serving, ok := itemByName(list, "serving")
		require.True(t, ok)
		leaf := s.Serving.Leaf()
		assert.Equal(t, certv1alpha1.RoleServing, serving.Status.Role)
		assert.Equal(t, "serving", serving.Status.Provider)
		assert.Equal(t, leaf.SerialNumber.Text(16), serving.Status.Serial)
		assert.Equal(t, hex.EncodeToString(leaf.AuthorityKeyId), serving.Status.AuthorityKeyID)
		assert.Equal(t, leaf.Subject.String(), serving.Status.Subject)
		assert.Equal(t, leaf.Issuer.String(), serving.Status.Issuer)
		assert.ElementsMatch(t, []string{"localhost", "127.0.0.1", "::1"}, serving.Status.Names)
		assert.Empty(t, serving.Status.SNINames)
		assert.True(t, serving.Status.NotAfter.Time.Equal(leaf.NotAfter.Truncate(time.Second)))
		assert.True(t, serving.Status.NotBefore.Time.Equal(leaf.NotBefore.Truncate(time.Second)))
		assert.Empty(t, serving.Status.Error)

		lb, ok := itemByName(list, loopback.ProviderName)
		require.True(t, ok)
		assert.Equal(t, certv1alpha1.RoleLoopback, lb.Status.Role)
		assert.Equal(t, s.Loopback.Leaf().SerialNumber.Text(16), lb.Status.Serial)
		assert.Equal(t, []string{loopback.ServerName}, lb.Status.SNINames)

		direct := s.ServingCertificates().Items
		require.Len(t, direct, len(list.Items))
		for i := range direct {
			assert.Equal(t, list.Items[i].Name, direct[i].Name, "ServingCertificates gives the same without HTTP")
			assert.Equal(t, list.Items[i].Status.Serial, direct[i].Status.Serial)
		}
	})

	t.Run("get by name", func(t *testing.T) {
		b, err := rc.Get().AbsPath(app.ServingCertificatesPath, "serving").DoRaw(ctx)
		require.NoError(t, err)
		var item certv1alpha1.ServingCertificate
		require.NoError(t, json.Unmarshal(b, &item))
		assert.Equal(t, "ServingCertificate", item.Kind)
		assert.Equal(t, "certificates.evercert.io/v1alpha1", item.APIVersion)
		assert.Equal(t, "serving", item.Name)

		_, err = rc.Get().AbsPath(app.ServingCertificatesPath, "nope").DoRaw(ctx)
		assert.True(t, apierrors.IsNotFound(err), "unknown name: %v", err)
		_, err = rc.Get().AbsPath(app.CertificatesVersionPath, "other").DoRaw(ctx)
		assert.True(t, apierrors.IsNotFound(err), "unknown resource: %v", err)
		_, err = rc.Get().AbsPath(app.CertificatesGroupPath, "v2").DoRaw(ctx)
		assert.True(t, apierrors.IsNotFound(err), "unknown version: %v", err)
	})

	t.Run("read-only, no watch", func(t *testing.T) {
		_, err := rc.Get().AbsPath(app.ServingCertificatesPath).Param("watch", "true").DoRaw(ctx)
		assert.True(t, apierrors.IsMethodNotSupported(err), "watch: %v", err)
		_, err = rc.Post().AbsPath(app.ServingCertificatesPath).Body([]byte("{}")).DoRaw(ctx)
		assert.True(t, apierrors.IsMethodNotSupported(err), "create: %v", err)
		_, err = rc.Delete().AbsPath(app.ServingCertificatesPath, "serving").DoRaw(ctx)
		assert.True(t, apierrors.IsMethodNotSupported(err), "delete: %v", err)
	})

	t.Run("content negotiation", func(t *testing.T) {
		hc, err := rest.HTTPClientFor(cfg)
		require.NoError(t, err)
		get := func(accept string) (*http.Response, string) {
			req, err := http.NewRequest(http.MethodGet, cfg.Host+app.ServingCertificatesPath, nil)
			require.NoError(t, err)
			req.Header.Set("Accept", accept)
			resp, err := hc.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp, string(b)
		}
		resp, body := get("application/yaml")
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Contains(t, body, "kind: ServingCertificateList")
		resp, _ = get("application/vnd.kubernetes.protobuf")
		assert.Equal(t, http.StatusNotAcceptable, resp.StatusCode, "no protobuf form")
		resp, body = get("application/vnd.kubernetes.protobuf, application/json")
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.Contains(t, body, `"kind":"ServingCertificateList"`)
	})

	t.Run("discovery", func(t *testing.T) {
		groups, err := cs.Discovery().ServerGroups()
		require.NoError(t, err)
		var found bool
		for _, g := range groups.Groups {
			if g.Name == certv1alpha1.GroupName {
				found = true
				assert.Equal(t, "v1alpha1", g.PreferredVersion.Version)
			}
		}
		assert.True(t, found, "legacy /apis lists the group")

		rl, err := cs.Discovery().ServerResourcesForGroupVersion("certificates.evercert.io/v1alpha1")
		require.NoError(t, err)
		require.Len(t, rl.APIResources, 1)
		r := rl.APIResources[0]
		assert.Equal(t, "servingcertificates", r.Name)
		assert.Equal(t, "ServingCertificate", r.Kind)
		assert.False(t, r.Namespaced)
		assert.ElementsMatch(t, []string{"get", "list"}, []string(r.Verbs))

		b, err := rc.Get().AbsPath(app.CertificatesGroupPath).DoRaw(ctx)
		require.NoError(t, err)
		var g metav1.APIGroup
		require.NoError(t, json.Unmarshal(b, &g))
		assert.Equal(t, certv1alpha1.GroupName, g.Name)

		// client-go's discovery client asks for the aggregated form first.
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		require.NoError(t, err)
		_, resources, err := dc.ServerGroupsAndResources()
		require.NoError(t, err)
		found = false
		for _, rl := range resources {
			if rl.GroupVersion == "certificates.evercert.io/v1alpha1" {
				for _, r := range rl.APIResources {
					found = found || r.Name == "servingcertificates"
				}
			}
		}
		assert.True(t, found, "aggregated discovery lists servingcertificates")
	})

	t.Run("anonymous is not authorized", func(t *testing.T) {
		anon, err := kubernetes.NewForConfig(rest.AnonymousClientConfig(cfg))
		require.NoError(t, err)
		_, err = anon.Discovery().RESTClient().Get().AbsPath(app.ServingCertificatesPath).DoRaw(ctx)
		assert.True(t, apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err), "want 401/403, got %v", err)
	})
}

// TestServingCertificatesFollowRotation runs the serving certificate with a
// 2s validity: the list shows each new leaf as soon as the provider has it.
func TestServingCertificatesFollowRotation(t *testing.T) {
	o := app.NewOptions()
	o.SelfcheckInterval = 0
	o.SelfSignedValidity = 2 * time.Second
	s := startServer(t, o, nil)
	cs, err := kubernetes.NewForConfig(s.GenericAPIServer.LoopbackClientConfig)
	require.NoError(t, err)
	rc := cs.Discovery().RESTClient()

	serials := map[string]bool{}
	deadline := time.Now().Add(15 * time.Second)
	for len(serials) < 3 && time.Now().Before(deadline) {
		before := s.Serving.Leaf().SerialNumber.Text(16)
		item, ok := itemByName(getServingCertificates(t, rc), "serving")
		require.True(t, ok)
		after := s.Serving.Leaf().SerialNumber.Text(16)
		assert.Contains(t, []string{before, after}, item.Status.Serial, "the list shows the provider's current leaf")
		serials[item.Status.Serial] = true
		time.Sleep(100 * time.Millisecond)
	}
	assert.GreaterOrEqual(t, len(serials), 3, "the listed serial follows rotation")
}
