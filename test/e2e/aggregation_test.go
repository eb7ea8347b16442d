//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	certv1alpha1 "github.com/evercert/evercert/example/apiserver/apis/certificates/v1alpha1"
	"github.com/evercert/evercert/example/apiserver/app"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/loopback"
)

const (
	aggServiceName = "evercert-apiserver"
	// aggIdentity is the user the aggregated server runs as: no
	// system:masters, only the RBAC an aggregated server needs.
	aggIdentity = "evercert-apiserver"
)

// grantAggregatedServer gives user what a delegating aggregated API server
// needs (TokenReview and SubjectAccessReview through system:auth-delegator,
// the extension-apiserver-authentication ConfigMap through
// extension-apiserver-authentication-reader) plus managing its own
// APIService, narrowed to its name where RBAC allows.
func grantAggregatedServer(t *testing.T, admin kubernetes.Interface, user string) {
	t.Helper()
	ctx := context.Background()
	subjects := []rbacv1.Subject{{Kind: "User", APIGroup: rbacv1.GroupName, Name: user}}
	rbac := admin.RbacV1()
	_, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + ":auth-delegator"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = rbac.RoleBindings(metav1.NamespaceSystem).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + ":auth-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user + ":apiservice"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{apiregistrationv1.GroupName}, Resources: []string{"apiservices"}, ResourceNames: []string{app.APIServiceName}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
			{APIGroups: []string{apiregistrationv1.GroupName}, Resources: []string{"apiservices"}, Verbs: []string{"create"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + ":apiservice"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user + ":apiservice"},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// grantServingCertificatesReader lets user list and get servingcertificates.
func grantServingCertificatesReader(t *testing.T, admin kubernetes.Interface, user string) {
	t.Helper()
	ctx := context.Background()
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user + ":servingcertificates"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{certv1alpha1.GroupName}, Resources: []string{certv1alpha1.Resource}, Verbs: []string{"get", "list"},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + ":servingcertificates"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user + ":servingcertificates"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: rbacv1.GroupName, Name: user}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// exposeOnLoopback creates the Service through which the aggregator reaches
// the aggregated server on 127.0.0.1: an ExternalName Service "localhost".
//
// The testcluster package documentation suggests a selector-less ClusterIP
// Service with an EndpointSlice holding 127.0.0.1, but this kube-apiserver
// rejects loopback addresses in EndpointSlices (ValidateEndpointIP: "may not
// be in the loopback range"), and an FQDN slice would need a two-label name
// that resolves to 127.0.0.1. So the test runs the kube-apiserver with
// --enable-aggregator-routing=false, whose cluster resolver sends an
// ExternalName Service's traffic to <externalName>:<APIService port>, and
// registers the APIService with the server's real port (--apiservice-port).
// The aggregator still verifies the serving certificate for
// <name>.<namespace>.svc.
func exposeOnLoopback(t *testing.T, admin kubernetes.Interface, name string) {
	t.Helper()
	_, err := admin.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

func apiServiceAvailable(a *apiregistrationv1.APIService) bool {
	for _, c := range a.Status.Conditions {
		if c.Type == apiregistrationv1.Available {
			return c.Status == apiregistrationv1.ConditionTrue
		}
	}
	return false
}

// apiServiceRecorder watches the APIService and counts caBundle changes and
// Available=False transitions until stop is called.
type apiServiceRecorder struct {
	mu             sync.Mutex
	last           []byte
	bundleChanges  int
	bundles        map[string]bool
	unavailable    int
	wasUnavailable bool
	done           chan struct{}
	cancel         context.CancelFunc
}

func recordAPIService(t *testing.T, agg aggregatorclient.Interface, initial *apiregistrationv1.APIService) *apiServiceRecorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := agg.ApiregistrationV1().APIServices().Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + app.APIServiceName, ResourceVersion: initial.ResourceVersion,
	})
	require.NoError(t, err)
	r := &apiServiceRecorder{last: initial.Spec.CABundle, bundles: map[string]bool{string(initial.Spec.CABundle): true}, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(r.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			a, ok := ev.Object.(*apiregistrationv1.APIService)
			if !ok {
				continue
			}
			r.mu.Lock()
			if !bytes.Equal(a.Spec.CABundle, r.last) {
				r.bundleChanges++
				r.last = a.Spec.CABundle
				r.bundles[string(a.Spec.CABundle)] = true
			}
			if avail := apiServiceAvailable(a); !avail && !r.wasUnavailable {
				r.unavailable++
				r.wasUnavailable = true
			} else if avail {
				r.wasUnavailable = false
			}
			r.mu.Unlock()
		}
	}()
	t.Cleanup(r.stop)
	return r
}

// stop ends the watch and waits for the recorder's goroutine.
func (r *apiServiceRecorder) stop() {
	r.cancel()
	<-r.done
}

// TestE2EAggregation runs the example apiserver in-process as an aggregated
// API server of a real kube-apiserver: delegated authentication and
// authorization, a self-registered APIService whose caBundle the cabundle
// publisher keeps equal to the serving CA bundle, and a serving certificate
// that lives 4s (its CA 12s). For a minute a client keeps reading
// servingcertificates through the kube-apiserver: not one request may fail
// although the serving leaf and CA rotate many times.
func TestE2EAggregation(t *testing.T) {
	const (
		run      = 60 * time.Second
		interval = 100 * time.Millisecond // 10 requests per second
		validity = 4 * time.Second
	)
	begin := time.Now()
	cluster := testcluster.Start(t,
		testcluster.WithUsers(testcluster.User{Name: aggIdentity}, testcluster.User{Name: "reader"}, testcluster.User{Name: "nobody"}),
		testcluster.WithAPIServerFlags("--enable-aggregator-routing=false")) // see exposeOnLoopback
	adminCfg := cluster.Config()
	admin := kubernetes.NewForConfigOrDie(adminCfg)
	agg := aggregatorclient.NewForConfigOrDie(adminCfg)
	setupNamespace(t, admin)
	grantAggregatedServer(t, admin, aggIdentity)
	grantServingCertificatesReader(t, admin, "reader")
	ctx := context.Background()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o := app.NewOptions()
	o.SecureServing.Listener = ln
	o.SecureServing.BindPort = 0
	o.APIServicePort = int32(ln.Addr().(*net.TCPAddr).Port)
	o.Kubeconfig = writeKubeconfig(t, cluster.UserConfig(aggIdentity)) // kubeconfig_test.go
	o.APIServiceService = ns + "/" + aggServiceName
	o.SelfSignedValidity = validity
	s, err := app.NewServer(o)
	require.NoError(t, err)
	require.NotNil(t, s.Publisher, "registers the APIService")
	exposeOnLoopback(t, admin, aggServiceName)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "aggregated server Run")
		case <-time.After(60 * time.Second):
			t.Error("aggregated server did not stop within 60s")
		}
	})

	// Registration: the APIService appears, with the serving CA bundle, and
	// becomes Available.
	var apiService *apiregistrationv1.APIService
	require.Eventually(t, func() bool {
		apiService, err = agg.ApiregistrationV1().APIServices().Get(ctx, app.APIServiceName, metav1.GetOptions{})
		return err == nil && apiServiceAvailable(apiService)
	}, 60*time.Second, 100*time.Millisecond, "APIService %s Available (last error %v)", app.APIServiceName, err)
	syncCtx, cancelSync := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSync()
	if !cache.WaitForCacheSync(syncCtx.Done(), s.Publisher.HasSynced) {
		t.Fatal("caBundle publisher not ready")
	}
	registered := time.Since(begin)
	spec := apiService.Spec
	assert.Equal(t, certv1alpha1.GroupName, spec.Group)
	assert.Equal(t, "v1alpha1", spec.Version)
	assert.EqualValues(t, 1000, spec.GroupPriorityMinimum)
	assert.EqualValues(t, 15, spec.VersionPriority)
	assert.False(t, spec.InsecureSkipTLSVerify)
	require.NotNil(t, spec.Service)
	assert.Equal(t, ns, spec.Service.Namespace)
	assert.Equal(t, aggServiceName, spec.Service.Name)
	assert.Equal(t, o.APIServicePort, *spec.Service.Port)
	assert.NotEmpty(t, spec.CABundle)
	recorder := recordAPIService(t, agg, apiService)

	// Discovery through the kube-apiserver lists the resource.
	require.Eventually(t, func() bool {
		rl, err := admin.Discovery().ServerResourcesForGroupVersion(certv1alpha1.SchemeGroupVersion.String())
		return err == nil && len(rl.APIResources) == 1 && rl.APIResources[0].Name == certv1alpha1.Resource
	}, 30*time.Second, 200*time.Millisecond, "discovery through the kube-apiserver")

	// A minute of reads through the kube-apiserver.
	rc := admin.Discovery().RESTClient()
	var (
		requests, failures int
		latencies          []time.Duration
		serials            = map[string]bool{}
		cas                = map[string]bool{}
		loopbackSeen       bool
	)
	svcDNS := aggServiceName + "." + ns + ".svc"
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	loopStart := time.Now()
	for end := loopStart.Add(run); time.Now().Before(end); <-ticker.C {
		requests++
		reqCtx, cancelReq := context.WithTimeout(ctx, 10*time.Second)
		start := time.Now()
		b, err := rc.Get().AbsPath(app.ServingCertificatesPath).DoRaw(reqCtx)
		cancelReq()
		latencies = append(latencies, time.Since(start))
		if err != nil {
			failures++
			if failures <= 10 {
				t.Errorf("request %d at +%v: %v", requests, time.Since(loopStart).Round(time.Millisecond), err)
			}
			continue
		}
		var list certv1alpha1.ServingCertificateList
		if err := json.Unmarshal(b, &list); err != nil {
			failures++
			t.Errorf("request %d: decoding %q: %v", requests, b, err)
			continue
		}
		var serving *certv1alpha1.ServingCertificate
		for i := range list.Items {
			switch list.Items[i].Name {
			case "serving":
				serving = &list.Items[i]
			case loopback.ProviderName:
				loopbackSeen = true
			}
		}
		if serving == nil || serving.Status.Role != certv1alpha1.RoleServing || !slices.Contains(serving.Status.Names, svcDNS) {
			failures++
			t.Errorf("request %d: no serving certificate for %s in %s", requests, svcDNS, b)
			continue
		}
		serials[serving.Status.Serial] = true
		cas[serving.Status.AuthorityKeyID] = true
	}
	loopDuration := time.Since(loopStart)
	recorder.stop()
	slices.Sort(latencies)
	pct := func(p int) time.Duration {
		return latencies[min(len(latencies)-1, len(latencies)*p/100)].Round(time.Millisecond)
	}

	recorder.mu.Lock()
	bundleChanges, distinctBundles, unavailable := recorder.bundleChanges, len(recorder.bundles), recorder.unavailable
	recorder.mu.Unlock()
	t.Logf("aggregation: %d requests in %v through the kube-apiserver, %d failures; latency p50 %v p99 %v max %v; "+
		"%d distinct serving serials, %d distinct serving CAs; APIService caBundle changed %d times (%d distinct bundles), "+
		"Available=False %d times; registered and Available %v after start",
		requests, loopDuration.Round(time.Millisecond), failures, pct(50), pct(99), latencies[len(latencies)-1].Round(time.Millisecond),
		len(serials), len(cas), bundleChanges, distinctBundles, unavailable, registered.Round(time.Millisecond))
	assert.Zero(t, failures, "no request may fail")
	assert.GreaterOrEqual(t, requests, int(run/interval)*8/10, "the client kept its rate")
	assert.True(t, loopbackSeen, "the loopback certificate is listed")
	assert.GreaterOrEqual(t, len(serials), 10, "the serving leaf rotated many times")
	assert.GreaterOrEqual(t, len(cas), 4, "at least 3 serving CA rotations")
	assert.GreaterOrEqual(t, bundleChanges, 3, "the APIService caBundle followed the CA rotations")
	assert.Zero(t, unavailable, "the APIService never became unavailable")

	t.Run("delegated authorization", func(t *testing.T) {
		// Through the kube-apiserver: it authorizes first, then the
		// aggregated server asks it again (SubjectAccessReview) for the
		// user it got in the request headers.
		reader := kubernetes.NewForConfigOrDie(cluster.UserConfig("reader")).Discovery().RESTClient()
		_, err := reader.Get().AbsPath(app.ServingCertificatesPath, "serving").DoRaw(ctx)
		assert.NoError(t, err, "reader through the kube-apiserver")
		nobody := kubernetes.NewForConfigOrDie(cluster.UserConfig("nobody")).Discovery().RESTClient()
		_, err = nobody.Get().AbsPath(app.ServingCertificatesPath).DoRaw(ctx)
		assert.True(t, apierrors.IsForbidden(err), "nobody through the kube-apiserver: want 403, got %v", err)

		// Directly: the bearer token is checked by TokenReview and the
		// request by SubjectAccessReview, both against the kube-apiserver.
		direct := func(user string) (int, string) {
			t.Helper()
			hc, err := rest.HTTPClientFor(&rest.Config{
				BearerToken:     cluster.UserConfig(user).BearerToken,
				TLSClientConfig: rest.TLSClientConfig{CAData: s.Serving.CurrentCABundleContent(), ServerName: "localhost"},
			})
			require.NoError(t, err)
			resp, err := hc.Get("https://" + s.Addr + app.ServingCertificatesPath)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(b)
		}
		code, body := direct("reader")
		assert.Equal(t, http.StatusOK, code, "reader directly: %s", body)
		code, body = direct("nobody")
		assert.Equal(t, http.StatusForbidden, code, "nobody directly: 403 from delegated authorization")
		assert.Contains(t, body, `User \"nobody\" cannot list resource \"servingcertificates\" in API group \"certificates.evercert.io\"`)
	})

	t.Run("caBundle drift is repaired", func(t *testing.T) {
		patch := []byte(`{"spec":{"caBundle":"` + "Z2FyYmFnZQ==" + `"}}`) // "garbage"
		_, err := agg.ApiregistrationV1().APIServices().Patch(ctx, app.APIServiceName, types.MergePatchType, patch, metav1.PatchOptions{})
		require.NoError(t, err)
		start := time.Now()
		require.Eventually(t, func() bool {
			a, err := agg.ApiregistrationV1().APIServices().Get(ctx, app.APIServiceName, metav1.GetOptions{})
			return err == nil && string(a.Spec.CABundle) != "garbage" && bytes.Contains(a.Spec.CABundle, []byte("BEGIN CERTIFICATE"))
		}, 10*time.Second, 20*time.Millisecond)
		t.Logf("caBundle written back after %v", time.Since(start).Round(time.Millisecond))
	})
	t.Logf("total %v", time.Since(begin).Round(time.Millisecond))
}
