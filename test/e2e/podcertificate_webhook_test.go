//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	signerapp "github.com/evercert/evercert/example/signer/app"
	"github.com/evercert/evercert/example/webhook/app"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/podcert"
)

// hostIP returns an IPv4 address of this machine that is not loopback:
// EndpointSlices may not hold loopback addresses, so a webhook on
// 127.0.0.1 cannot be reached through the Service its certificate names.
func hostIP(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.To4()
		}
	}
	t.Fatal("this test needs a non-loopback IPv4 address for the webhook's EndpointSlice; the machine has none")
	return nil
}

// exposeService points the Service webhookAppNS/webhookSvc (port 443,
// named https) at ip:port with an EndpointSlice, as the EndpointSlice
// controller would for a ready pod at that address. The
// kube-apiserver (endpoint routing, the harness default) then dials ip:port
// and verifies the certificate for <svc>.<ns>.svc.
func exposeService(t *testing.T, admin kubernetes.Interface, ip net.IP, port int32) {
	t.Helper()
	ctx := context.Background()
	_, err := admin.DiscoveryV1().EndpointSlices(webhookAppNS).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: webhookSvc + "-e2e", Labels: map[string]string{
			discoveryv1.LabelServiceName: webhookSvc, discoveryv1.LabelManagedBy: "e2e.evercert.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// TestE2EPodCertificateWebhook is issue 13's end to end test, on a real
// kube-apiserver with the Node authorizer and NodeRestriction:
//
//   - Two replicas of the example signer sign PodCertificateRequests for
//     evercert.io/serving and publish their CA bundle into the
//     ClusterTrustBundle evercert.io:serving:ca (cabundle's
//     ClusterTrustBundle target, an observer of their Authority). Their CA
//     rotates every ~15 s on the real clock (see rotateFlags).
//   - The test is the kubelet of one node: for the webhook pod (Node,
//     ServiceAccount, Pod with spec.nodeName and a podCertificate volume,
//     Service) it creates the requests as system:node:e2e-node and writes
//     each issued credential bundle with the kubelet's ..data symlink swap.
//   - The example webhook serves that file (--tls-cert-file and
//     --tls-private-key-file: dynamiccert.FileCertKey behind the sni
//     controller) on this machine's address, reached through its Service,
//     and publishes the signer's ClusterTrustBundles into its
//     ValidatingWebhookConfiguration (--ca-from-signer), verified against
//     the certificate it serves.
//   - For 60 s the kube-apiserver calls the webhook for ConfigMaps: not one
//     admission may fail, through at least 3 CA rotations and a refresh of
//     the pod's certificate every 2 s. A pod outside the policy is denied.
//   - Then the caBundle is wiped (a re-apply): the verification reports it
//     within seconds (evercert_cabundle_unverified_total, readiness, a
//     Warning Event), drift repair restores it, verification recovers and
//     admissions work again.
func TestE2EPodCertificateWebhook(t *testing.T) {
	const (
		run = 60 * time.Second
		// The kubelet refreshes at beginRefreshAt, which the API puts at
		// least 10 min after notBefore; leaves live at least 1 h (the
		// API's minimum). On the real clock a 60 s run sees no such
		// refresh, so the test refreshes every refreshEvery instead: the
		// same request, write and reload, only sooner.
		refreshEvery = 2 * time.Second
		minRotations = 3
		// The run goes on past run, up to maxRun, until minRotations CA
		// rotations happened: on a loaded machine a successor has been
		// seen waiting 20-30 s for a replica (see the report logged).
		maxRun = 150 * time.Second
	)
	// A new CA every ~15 s: its successor is published 12 s after it was
	// made and signs 3 s later, once both replicas and the
	// ClusterTrustBundle hold it. CAs live 2 h, so leaves (capped at their
	// CA's expiry) live ~2 h, above the API's minimum of 1 h, and no clock
	// needs faking: the API server checks notBefore against its own clock.
	rotateFlags := []string{"--self-signed-validity=1h", "--ca-validity=2h", "--ca-renew-before=1h59m48s", "--ca-propagation-delay=3s"}

	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: signerUser}, testcluster.User{Name: webhookUser}),
		testcluster.WithAPIServerFlags("--authorization-mode=Node", "--enable-admission-plugins=NodeRestriction"))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	ctx := context.Background()
	webhookNamespaces(t, admin)
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: webhookAppNS}}, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, sa := range []string{webhookAppSA, "intruder"} {
		_, err := admin.CoreV1().ServiceAccounts(webhookAppNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	_, err = admin.CoreV1().Services(webhookAppNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: webhookSvc},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "evercert-example-webhook"},
			Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	applySignerRBAC(t, admin, signerUser, signerCASecret)
	applyWebhookRBAC(t, admin, webhookUser, webhookCASecret, app.DefaultConfigurationName)
	history := followCA(t, admin)

	// --- The signer, publishing its ClusterTrustBundle.
	signerKubeconfig := writeKubeconfig(t, cluster.UserConfig(signerUser))
	replicas := []*signerapp.Signer{startSignerReplica(t, signerKubeconfig, rotateFlags...), startSignerReplica(t, signerKubeconfig, rotateFlags...)}
	for i, r := range replicas {
		select {
		case <-r.Ready():
		case <-time.After(time.Minute):
			t.Fatalf("signer replica %d not ready within a minute", i)
		}
	}
	ctbName := cabundle.ClusterTrustBundleName(signerName, signerapp.DefaultClusterTrustBundle)
	ctb, err := admin.CertificatesV1().ClusterTrustBundles().Get(ctx, ctbName, metav1.GetOptions{})
	require.NoError(t, err, "the signer created its ClusterTrustBundle")
	require.Equal(t, signerName, ctb.Spec.SignerName)

	// --- The webhook pod's identity and first certificate, as the kubelet.
	k := startKubelet(t, cluster, admin)
	web, err := admin.CoreV1().Pods(webhookAppNS).Create(ctx, examplePod(t, "webhook-0", nil), metav1.CreateOptions{})
	require.NoError(t, err)
	intruder, err := admin.CoreV1().Pods(webhookAppNS).Create(ctx, examplePod(t, "intruder", func(p *corev1.Pod) { p.Spec.ServiceAccountName = "intruder" }), metav1.CreateOptions{})
	require.NoError(t, err)
	_, denied, _ := k.request(intruder)
	require.Equal(t, certificatesv1.PodCertificateRequestConditionTypeDenied, denied.Status.Conditions[0].Type, denied.Status.Conditions[0].Message)
	require.Equal(t, podcert.ReasonNotAllowed, denied.Status.Conditions[0].Reason)

	var (
		mu        sync.Mutex
		latencies []time.Duration
		leafCAs   = map[string]bool{}
		lastLeaf  *tls.Certificate
		path      string
	)
	refresh := func() {
		t.Helper()
		key, pcr, took := k.request(web)
		c := pcr.Status.Conditions[0]
		require.Equal(t, certificatesv1.PodCertificateRequestConditionTypeIssued, c.Type, "%s: %s %s", pcr.Name, c.Reason, c.Message)
		p := k.writeBundle(web, key, pcr)
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		pair, err := tls.X509KeyPair(data, data)
		require.NoError(t, err)
		ca := signedFrom(t, parseCert([]byte(pcr.Status.CertificateChain)), replicas[0].CABundle())
		mu.Lock()
		defer mu.Unlock()
		latencies = append(latencies, took)
		leafCAs[ca.SerialNumber.Text(16)] = true
		lastLeaf, path = &pair, p
	}
	refresh()

	// --- The webhook, serving the credential bundle file.
	ip := hostIP(t)
	w := runWebhookApp(t,
		"--bind-address="+ip.String(), "--secure-port=0",
		"--kubeconfig="+writeKubeconfig(t, cluster.UserConfig(webhookUser)),
		"--tls-cert-file="+path, "--tls-private-key-file="+path,
		"--ca-from-signer="+signerName,
		"--webhook-service="+webhookAppNS+"/"+webhookSvc,
		"--validating-webhook-configuration="+app.DefaultConfigurationName, "--mutating-webhook-configuration=",
	)
	select {
	case <-w.Listening():
	case <-time.After(30 * time.Second):
		t.Fatal("webhook not listening within 30s")
	}
	port, err := strconv.Atoi(func() string { _, p, _ := net.SplitHostPort(w.Addr().String()); return p }())
	require.NoError(t, err)
	exposeService(t, admin, ip, int32(port))
	vwh := app.Registration{}.ValidatingWebhook(nil)
	vwh.ClientConfig = admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
		Namespace: webhookAppNS, Name: webhookSvc, Path: ptr.To(app.ValidatePath), Port: ptr.To[int32](443),
	}}
	_, err = admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: app.DefaultConfigurationName},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{vwh},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	waitReady(t, w)

	verifiedLabels := map[string]string{"kind": string(cabundle.ValidatingWebhookConfiguration), "name": app.DefaultConfigurationName}
	episodes := func() float64 { return certmetricstest.Value(t, "evercert_cabundle_unverified_total", verifiedLabels) }
	ctbEpisodes := func() float64 {
		return certmetricstest.Value(t, "evercert_cabundle_unverified_total", map[string]string{"kind": string(cabundle.ClusterTrustBundle), "name": ctbName})
	}
	episodesBefore, ctbEpisodesBefore := episodes(), ctbEpisodes()

	// --- 60 s of admissions through CA rotations and certificate refreshes.
	cms := func(cm *corev1.ConfigMap) error {
		_, err := admin.CoreV1().ConfigMaps(webhookEnabledNS).Create(ctx, cm, metav1.CreateOptions{})
		return err
	}
	var admitted, deniedCMs, failed atomic.Int64
	admit := func(i int) {
		if err := cms(newConfigMap(fmt.Sprintf("ok-%d", i), true)); err != nil {
			failed.Add(1)
			t.Errorf("admission %d of a labelled ConfigMap failed: %v", i, err)
		} else {
			admitted.Add(1)
		}
		if err := cms(newConfigMap(fmt.Sprintf("bad-%d", i), false)); !isDenial(err) {
			failed.Add(1)
			t.Errorf("admission %d of an unlabelled ConfigMap: %v, want the webhook's denial", i, err)
		} else {
			deniedCMs.Add(1)
		}
	}
	rotations := func() int {
		history.mu.Lock()
		defer history.mu.Unlock()
		return len(history.signing) - 1
	}
	begin := time.Now()
	running := func() bool {
		if t.Failed() {
			return false
		}
		took := time.Since(begin)
		return took < run || (took < maxRun && rotations() < minRotations)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; running(); i++ {
			admit(i)
			time.Sleep(100 * time.Millisecond) // pacing, not an assertion
		}
	})
	wg.Go(func() {
		for running() {
			time.Sleep(refreshEvery) // pacing, not an assertion
			refresh()
		}
	})
	wg.Wait()
	ran := time.Since(begin)
	require.False(t, t.Failed())
	history.mu.Lock()
	signingCAs := len(history.signing)
	history.mu.Unlock()
	// What a waiting successor waits for, and what the ClusterTrustBundle
	// holds: the figures to look at when rotations fall short.
	for i, r := range replicas {
		if st := r.Authority().Status(); st.Successor != nil {
			t.Logf("signer replica %d: successor CA %s (fingerprint %s) published at %s waits for %v",
				i, st.Successor.Serial, st.Successor.Fingerprint, st.Successor.PublishedAt.Format(time.RFC3339Nano), st.Successor.Pending)
		}
	}
	if cur, err := admin.CertificatesV1().ClusterTrustBundles().Get(ctx, ctbName, metav1.GetOptions{}); assert.NoError(t, err) {
		cas, err := pki.ParseCABundle([]byte(cur.Spec.TrustBundle))
		require.NoError(t, err)
		fps := make([]string, 0, len(cas))
		for _, c := range cas {
			fps = append(fps, authority.Fingerprint(c))
		}
		t.Logf("ClusterTrustBundle %s holds the CAs %v", ctbName, fps)
	}
	require.GreaterOrEqual(t, signingCAs-1, minRotations, "CA rotations during the run")
	assert.Zero(t, failed.Load(), "failed admissions")
	assert.Equal(t, episodesBefore, episodes(), "the caBundle verified the served certificate throughout")
	assert.Equal(t, ctbEpisodesBefore, ctbEpisodes(), "the ClusterTrustBundle verified the signer's leaf throughout")

	// The webhook serves the last certificate the kubelet wrote.
	mu.Lock()
	want := lastLeaf.Leaf
	mu.Unlock()
	require.Eventually(t, func() bool {
		got, err := tlstest.Dial(w.Addr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only the serial is compared
		return err == nil && got.SerialNumber.Cmp(want.SerialNumber) == 0
	}, 30*time.Second, 20*time.Millisecond, "the webhook serves the last credential bundle written")

	// --- A re-apply wipes the caBundle: reported, repaired, verified again.
	vwcs := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	cur, err := vwcs.Get(ctx, app.DefaultConfigurationName, metav1.GetOptions{})
	require.NoError(t, err)
	cur.Webhooks[0].ClientConfig.CABundle = nil
	wiped := time.Now()
	_, err = vwcs.Update(ctx, cur, metav1.UpdateOptions{FieldManager: "helm"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		err := w.HealthCheck().Check(nil)
		return episodes() == episodesBefore+1 || (err != nil && strings.Contains(err.Error(), "does not verify"))
	}, 10*time.Second, 5*time.Millisecond, "the wiped caBundle is reported as unverified")
	require.Eventually(t, func() bool { return episodes() == episodesBefore+1 }, 10*time.Second, 5*time.Millisecond,
		"the wiped caBundle is counted as unverified")
	detected := time.Since(wiped)
	// Readiness no longer reports a bundle that does not verify. (It may
	// still report the caBundle contested for a while: the wipe is a
	// change by another writer, and with the source changing at every
	// rotation the publisher may already have counted two; see the
	// report.)
	require.Eventually(t, func() bool {
		err := w.HealthCheck().Check(nil)
		return certmetricstest.Value(t, "evercert_cabundle_verified", verifiedLabels) == 1 &&
			(err == nil || !strings.Contains(err.Error(), "does not verify"))
	}, 30*time.Second, 20*time.Millisecond, "the caBundle is repaired and verifies again")
	recovered := time.Since(wiped)
	require.Eventually(t, func() bool {
		evs, err := admin.EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		for _, ev := range evs.Items {
			if ev.Reason == "CABundleUnverified" && ev.Type == corev1.EventTypeWarning && ev.Regarding.Name == app.DefaultConfigurationName {
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "a Warning Event CABundleUnverified on the configuration")
	admit(1 << 20) // admissions work again

	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	t.Logf("ran %v: %d admissions (%d admitted, %d denied by the webhook), %d failed; %d CA rotations (%d signing CAs), leaves from %d CAs; %d certificates issued to the webhook pod",
		ran.Round(time.Second), admitted.Load()+deniedCMs.Load(), admitted.Load(), deniedCMs.Load(), failed.Load(), signingCAs-1, signingCAs, len(leafCAs), len(latencies))
	t.Logf("request-to-issued as the kubelet sees it, n=%d: p50 %v, p99 %v, max %v",
		len(latencies), percentile(latencies, 0.50).Round(100*time.Microsecond), percentile(latencies, 0.99).Round(100*time.Microsecond),
		latencies[len(latencies)-1].Round(100*time.Microsecond))
	t.Logf("wiped caBundle: reported unverified after %v, repaired and verified after %v", detected.Round(time.Millisecond), recovered.Round(time.Millisecond))
}
