//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/loopback"
	"github.com/evercert/evercert/test/sampleapiserver"
)

// connTracker is a listener that remembers the connections it accepted, so
// that the test can drop them all: every client, the loopback informer of
// the admission plugin included, must then dial again and verify the server
// afresh.
type connTracker struct {
	net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (l *connTracker) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.conns[c] = struct{}{}
	l.mu.Unlock()
	return c, nil
}

// dropAll closes every connection accepted so far and returns how many.
func (l *connTracker) dropAll() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.conns)
	for c := range l.conns {
		_ = c.Close()
	}
	clear(l.conns)
	return n
}

// sampleClient is a client of the sample server from outside: it
// authenticates with token (delegated to the kube-apiserver by TokenReview)
// and verifies the serving certificate for "localhost" against bundle at
// now, over connections of its own.
type sampleClient struct {
	flunders dynamic.NamespaceableResourceInterface
	http     *http.Client
	host     string
}

func newSampleClient(t *testing.T, addr, token string, bundle []byte, now func() time.Time) *sampleClient {
	t.Helper()
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: tlstest.Pool(t, bundle), ServerName: "localhost", Time: now},
		ForceAttemptHTTP2: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	cfg := &rest.Config{Host: "https://" + addr, BearerToken: token, Transport: tr}
	hc, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)
	dc, err := dynamic.NewForConfigAndClient(cfg, hc)
	require.NoError(t, err)
	return &sampleClient{flunders: dc.Resource(sampleapiserver.FlunderGroupVersionResource), http: hc, host: cfg.Host}
}

// get returns the status and body of GET path.
func (c *sampleClient) get(ctx context.Context, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.host+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func newFlunder(name, reference string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": sampleapiserver.SchemeGroupVersion.String(),
		"kind":       "Flunder",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"reference": reference},
	}}
}

// isNotInCache reports whether err is RequireReference's rejection of a
// reference its informer has not seen.
func isNotInCache(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "is not in the informer's cache")
}

// servedLeafSerial handshakes with addr for serverName, verifying against
// bundle at now.
func servedLeafSerial(t *testing.T, addr, serverName string, bundle []byte, now func() time.Time) *big.Int {
	t.Helper()
	leaf, err := tlstest.Dial(addr, &tls.Config{ServerName: serverName, RootCAs: tlstest.Pool(t, bundle), Time: now})
	require.NoError(t, err, "handshake for %q", serverName)
	return leaf.SerialNumber
}

// TestE2ESampleAPIServer runs test/sampleapiserver, an aggregated API server
// shaped like k8s.io/sample-apiserver and wired with
// loopback.ApplyRecommendedOptions: upstream's RecommendedOptions with etcd
// storage in the test cluster's etcd, delegated authentication and
// authorization, CoreAPI and the default admission plugins against its
// kube-apiserver, and the RequireReference admission plugin, whose informer
// reads the server through the loopback client config it got in
// ExtraAdmissionInitializers.
//
// A fake clock drives the loopback certificate and the serving certificate
// (a self-signed provider picked through ServingOptions.Serving); the
// server's own Run loops rotate them, leaves and CAs. After every rotation
// the test drops every connection to the server, creates a Flunder through
// a new external client that trusts the current serving CA bundle, then one
// that references it: admission admits the second only once the informer,
// reconnected through the loopback client after the rotation, has seen the
// first.
func TestE2ESampleAPIServer(t *testing.T) {
	t.Parallel() // reads no process-global metric: see main_test.go
	cluster := testcluster.Start(t)
	adminCfg := cluster.Config()
	kubeconfig := writeKubeconfig(t, adminCfg) // kubeconfig_test.go
	ctx := context.Background()

	fc := clocktesting.NewFakeClock(time.Now())
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Name: "sample-serving", Hosts: []string{"localhost"}, Lifetime: 36 * time.Hour, Clock: fc,
	})
	require.NoError(t, err)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := &connTracker{Listener: inner, conns: map[net.Conn]struct{}{}}
	addr := inner.Addr().String()

	o := sampleapiserver.NewOptions()
	ro := o.RecommendedOptions
	ro.Etcd.StorageConfig.Transport.ServerList = []string{cluster.EtcdURL()}
	ro.SecureServing.Listener = ln
	ro.CoreAPI.CoreAPIKubeconfigPath = kubeconfig
	ro.Authentication.RemoteKubeConfigFile = kubeconfig
	ro.Authorization.RemoteKubeConfigFile = kubeconfig
	// The test cluster runs without API priority and fairness, so it has no
	// flow schemas for this server's filter either.
	ro.Features.EnablePriorityAndFairness = false
	o.Serving = loopback.ApplyConfig{Loopback: loopback.CertificateConfig{Clock: fc}, Serving: serving}

	// The in-memory serving CA is published into an APIService's caBundle
	// (Options.APIService) and follows every CA rotation. The APIService is
	// the deployer's; its Service does not exist, so the aggregator never
	// routes to it and nothing else in the test depends on it.
	aggregator, err := aggregatorclient.NewForConfig(adminCfg)
	require.NoError(t, err)
	const apiServiceName = "v1alpha1." + sampleapiserver.GroupName
	port := int32(443)
	_, err = aggregator.ApiregistrationV1().APIServices().Create(ctx, &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: apiServiceName},
		Spec: apiregistrationv1.APIServiceSpec{
			Group: sampleapiserver.GroupName, Version: "v1alpha1", GroupPriorityMinimum: 1000, VersionPriority: 15,
			Service: &apiregistrationv1.ServiceReference{Namespace: metav1.NamespaceDefault, Name: "evercert-sample-absent", Port: &port},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, aggregator.ApiregistrationV1().APIServices().Delete(context.Background(), apiServiceName, metav1.DeleteOptions{}))
	})
	o.APIService = apiServiceName
	publishedBundle := func() []byte {
		got, err := aggregator.ApiregistrationV1().APIServices().Get(ctx, apiServiceName, metav1.GetOptions{})
		require.NoError(t, err)
		return got.Spec.CABundle
	}

	cfg, err := o.Config()
	require.NoError(t, err)
	lb := cfg.Applied.Loopback
	require.NotNil(t, lb)
	require.Same(t, serving, cfg.Applied.Serving)
	// One loopback, evercert's: its certificate is the only SNI certificate
	// and its check the only "loopback-serving-certificate" check.
	require.Len(t, cfg.GenericConfig.SecureServing.SNICerts, 1)
	assert.Same(t, lb, cfg.GenericConfig.SecureServing.SNICerts[0])
	for name, checks := range map[string][]healthz.HealthChecker{"healthz": cfg.GenericConfig.HealthzChecks, "livez": cfg.GenericConfig.LivezChecks} {
		var found []healthz.HealthChecker
		for _, c := range checks {
			if c.Name() == loopback.HealthCheckName {
				found = append(found, c)
			}
		}
		require.Len(t, found, 1, name)
		assert.Equal(t, lb.HealthCheck(), found[0], "the %s loopback check is evercert's", name)
	}

	s, err := cfg.New()
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "sample server Run")
		case <-time.After(60 * time.Second):
			t.Error("sample server did not stop within 60s")
		}
	})

	token := adminCfg.BearerToken
	client := newSampleClient(t, addr, token, serving.CurrentCABundleContent(), fc.Now)
	var status int
	var body string
	ready := assert.Eventually(t, func() bool {
		status, body, err = client.get(ctx, "/readyz?verbose")
		return err == nil && status == http.StatusOK
	}, 60*time.Second, 100*time.Millisecond, "sample server ready")
	require.True(t, ready, "last: %d %v\n%s", status, err, body)
	assert.Contains(t, body, "[+]apiservice-ca-bundle ok")
	assert.Equal(t, string(serving.CurrentCABundleContent()), string(publishedBundle()), "the APIService's caBundle is the serving CA bundle")
	for _, path := range []string{"/healthz?verbose", "/livez?verbose"} {
		status, body, err := client.get(ctx, path)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, body)
		assert.Equal(t, 1, strings.Count(body, loopback.HealthCheckName), "%s lists one loopback check:\n%s", path, body)
	}

	const namespace = metav1.NamespaceDefault
	_, err = client.flunders.Namespace(namespace).Create(ctx, newFlunder("dangling", "missing"), metav1.CreateOptions{})
	require.True(t, isNotInCache(err), "RequireReference rejects a reference it has not seen: %v", err)

	loopbackLeaves, loopbackCAs := map[string]bool{}, map[string]bool{}
	servingLeaves, servingCAs := map[string]bool{}, map[string]bool{}
	record := func() {
		loopbackLeaves[lb.Leaf().SerialNumber.Text(16)] = true
		loopbackCAs[string(lb.Leaf().AuthorityKeyId)] = true
		servingLeaves[serving.Leaf().SerialNumber.Text(16)] = true
		servingCAs[string(serving.Leaf().AuthorityKeyId)] = true
	}
	record()
	var dropped int
	var slowest time.Duration
	start := fc.Now()
	steps := 0
	for step := 0; len(loopbackCAs) < 3 || len(servingCAs) < 3; step++ {
		steps++
		require.Less(t, step, 100, "two loopback and two serving CA rotations within 100 steps")
		// The next renewal: the server's rotation loops wake up and renew.
		fc.SetTime(minTime(lb.RenewAt(), serving.RenewAt()).Add(time.Millisecond))
		require.Eventually(t, func() bool {
			return lb.RenewAt().After(fc.Now()) && serving.RenewAt().After(fc.Now())
		}, 30*time.Second, time.Millisecond, "step %d: the rotation loops renewed what was due", step)
		record()
		require.Eventually(t, func() bool {
			return servedLeafSerial(t, addr, loopback.ServerName, lb.CurrentCABundleContent(), fc.Now).Cmp(lb.Leaf().SerialNumber) == 0 &&
				servedLeafSerial(t, addr, "localhost", serving.CurrentCABundleContent(), fc.Now).Cmp(serving.Leaf().SerialNumber) == 0
		}, 30*time.Second, 5*time.Millisecond, "step %d: the server serves the current leaves", step)

		// Every client reconnects from here on, verifying the new leaves.
		dropped += ln.dropAll()
		client := newSampleClient(t, addr, token, serving.CurrentCABundleContent(), fc.Now)
		name := fmt.Sprintf("step-%d", step)
		_, err := client.flunders.Namespace(namespace).Create(ctx, newFlunder(name, ""), metav1.CreateOptions{})
		require.NoError(t, err, "step %d: create %s", step, name)
		created := time.Now()
		var refErr error
		seen := assert.Eventually(t, func() bool {
			_, refErr = client.flunders.Namespace(namespace).Create(ctx, newFlunder(name+"-ref", name), metav1.CreateOptions{})
			return !isNotInCache(refErr) // admitted, or an unexpected error
		}, 60*time.Second, 20*time.Millisecond, "step %d: the loopback informer saw %s", step, name)
		require.True(t, seen, "step %d: last error %v", step, refErr)
		require.NoError(t, refErr, "step %d", step)
		slowest = max(slowest, time.Since(created))
	}

	// Still one loopback check after all rotations, passing.
	client = newSampleClient(t, addr, token, serving.CurrentCABundleContent(), fc.Now)
	for _, path := range []string{"/healthz?verbose", "/livez?verbose"} {
		status, body, err := client.get(ctx, path)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status, body)
		assert.Equal(t, 1, strings.Count(body, "[+]"+loopback.HealthCheckName+" ok"), "%s:\n%s", path, body)
	}
	require.Eventually(t, func() bool { return bytes.Equal(publishedBundle(), serving.CurrentCABundleContent()) }, 60*time.Second, 10*time.Millisecond,
		"after %d serving CA rotations the APIService's caBundle is the current serving CA bundle", len(servingCAs)-1)
	list, err := client.flunders.Namespace(namespace).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	t.Logf("%d steps, fake clock advanced %v: %d loopback leaves (%d CAs), %d serving leaves (%d CAs); %d connections dropped; slowest informer catch-up %v",
		steps, fc.Since(start).Round(time.Hour), len(loopbackLeaves), len(loopbackCAs), len(servingLeaves), len(servingCAs), dropped, slowest.Round(time.Millisecond))
	assert.Len(t, list.Items, 2*steps, "two flunders per step, stored in etcd")
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
