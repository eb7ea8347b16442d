package controllerruntime

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
)

func init() { ctrllog.SetLogger(klog.Background()) }

const (
	testNS        = "evercert-cr"
	vwcName       = "evercert-cr-test"
	leaderID      = "evercert-cr-test-leader"
	webhookPath   = "/validate"
	selectorLabel = "evercert-cr-test"
)

// TestAddWebhookThroughRotationsOnNonLeader is the one call in a real
// manager against a real kube-apiserver: a validating webhook registered on
// the manager's webhook server, a ValidatingWebhookConfiguration with
// failurePolicy Fail pointing at it, a CRD whose conversion webhook the
// manager serves too, and Add with short real lifetimes (the
// kube-apiserver checks certificates on the real clock). Another holder
// keeps the manager's leader Lease, so the manager never leads: everything
// Add wires must run on a non-leader replica.
//
// It shows, in order: /readyz/evercert on the health probe port fails while
// the configuration does not exist (so Ready cannot be closed) and passes
// once it does; Ready closes; the configuration's caBundle holds the CA of
// the Authority's Secret and verifies the served leaf; the kube-apiserver
// calls the webhook (an object it denies is refused with its message, one it
// allows is created) and the conversion webhook (a v1 widget read as v2);
// and both keep succeeding, with 0 failures, through leaf rotations and CA
// rotations (leaves signed by three CAs served).
func TestAddWebhookThroughRotationsOnNonLeader(t *testing.T) {
	cluster := testcluster.Start(t)
	restConfig := cluster.Config()
	client := kubernetes.NewForConfigOrDie(restConfig)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// Someone else holds the leader Lease for an hour.
	now := metav1.NewMicroTime(time.Now())
	_, err = client.CoordinationV1().Leases(testNS).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: leaderID},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someone-else"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	port, probePort := freePort(t), freePort(t)
	// A CRD whose conversion webhook is served by the manager: the
	// kube-apiserver calls it for every read of a stored v1 widget as v2.
	ext := apiextensionsclient.NewForConfigOrDie(restConfig)
	_, err = ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, widgetCRD(port), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crdName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true
			}
		}
		return false
	}, time.Minute, 50*time.Millisecond, "the CRD is not established")

	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  net.JoinHostPort("127.0.0.1", strconv.Itoa(probePort)),
		WebhookServer:           webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port}),
		LeaderElection:          true,
		LeaderElectionID:        leaderID,
		LeaderElectionNamespace: testNS,
	})
	require.NoError(t, err)
	var calls atomic.Int64
	mgr.GetWebhookServer().Register(webhookPath, &webhook.Admission{Handler: admission.HandlerFunc(
		func(_ context.Context, req admission.Request) admission.Response {
			calls.Add(1)
			if strings.HasPrefix(req.Name, "ok-") {
				return admission.Allowed("")
			}
			return admission.Denied("evercert test webhook denies " + req.Name)
		})})
	var conversions atomic.Int64
	mgr.GetWebhookServer().Register(convertPath, convertHandler(&conversions))

	certs, err := Add(mgr, Config{
		Namespace: testNS, SecretName: "webhook-ca", Hosts: []string{"127.0.0.1"},
		ValidatingWebhooks: []string{vwcName}, CRDs: []string{crdName},
		// Leaves every 2s, CAs every 6s; the kube-apiserver uses the
		// real clock, so the lifetimes are real and short.
		Authority: authority.Config{
			Lifetime: 4 * time.Second, RenewBefore: 2 * time.Second,
			CALifetime: 12 * time.Second, CARenewBefore: 6 * time.Second, PropagationDelay: 2 * time.Second,
		},
	})
	require.NoError(t, err)

	// At the moment Ready closes, the configuration must already hold
	// the bundle (read from the API server right then).
	atReady := make(chan error, 1)
	go func() {
		select {
		case <-certs.Ready():
		case <-ctx.Done():
			atReady <- ctx.Err()
			return
		}
		vwc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), vwcName, metav1.GetOptions{})
		switch {
		case err != nil:
			atReady <- fmt.Errorf("Ready closed, but reading the webhook configuration: %w", err)
		case len(vwc.Webhooks[0].ClientConfig.CABundle) == 0:
			atReady <- errors.New("Ready closed before the caBundle was published")
		default:
			atReady <- nil
		}
	}()

	started := make(chan error, 1)
	go func() { started <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-started:
			assert.NoError(t, err)
		case <-time.After(time.Minute):
			t.Error("the manager did not stop")
		}
	})

	// (e) Not ready while the configuration is missing. The probe server
	// answers once the manager has started.
	readyz := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(probePort)) + "/readyz/" + CheckName
	var status int
	var body string
	require.Eventually(t, func() bool {
		status, body, err = get(readyz)
		return err == nil
	}, time.Minute, 50*time.Millisecond, "the health probe server does not answer")
	// Once a certificate is served, only the missing configuration holds
	// the gate.
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	require.Eventually(t, func() bool {
		_, err := tlstest.Dial(addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only: is a certificate served?
		return err == nil
	}, time.Minute, 50*time.Millisecond, "no certificate served")
	status, body, err = get(readyz)
	require.NoError(t, err)
	assert.Equal(t, http.StatusInternalServerError, status, "ready before the webhook configuration exists: %s", body)
	assert.Contains(t, body, "ValidatingWebhookConfiguration/"+vwcName+": not published yet")
	// The gate's condition, read now (the Ready channel follows it within
	// a poll period, so reading the channel here would prove nothing).
	assert.False(t, certs.gateOpen(), "the gate is open before the webhook configuration exists")
	select {
	case <-certs.Ready():
		t.Fatal("Ready closed before the webhook configuration exists")
	default:
	}

	_, err = client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, validatingConfig(port), metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), vwcName, metav1.DeleteOptions{})
	})

	// (a) Ready closes.
	select {
	case <-certs.Ready():
	case <-time.After(2 * time.Minute):
		status, body, _ = get(readyz)
		t.Fatalf("Ready not closed; /readyz/%s: %d %s", CheckName, status, body)
	}
	require.NoError(t, <-atReady)
	// (e) The ready check passes (a CA rotation can make it fail for a
	// moment, so poll).
	require.Eventually(t, func() bool {
		status, body, err = get(readyz)
		return err == nil && status == http.StatusOK
	}, time.Minute, 50*time.Millisecond, "readyz after Ready")

	// (b) The caBundle holds the Secret's CA and verifies the leaf served.
	vwc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwcName, metav1.GetOptions{})
	require.NoError(t, err)
	secret, err := client.CoreV1().Secrets(testNS).Get(ctx, "webhook-ca", metav1.GetOptions{})
	require.NoError(t, err)
	published, err := pki.ParseCABundle(vwc.Webhooks[0].ClientConfig.CABundle)
	require.NoError(t, err)
	inSecret, err := pki.ParseCABundle(secret.Data["ca.crt"])
	require.NoError(t, err)
	assert.True(t, containsAll(published, inSecret[:1]) || containsAll(inSecret, published[:1]), "the caBundle and the Secret's ca.crt share no CA")
	_, err = tlstest.Dial(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), &tls.Config{RootCAs: tlstest.Pool(t, vwc.Webhooks[0].ClientConfig.CABundle)})
	require.NoError(t, err, "the published caBundle verifies the served leaf")
	crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crdName, metav1.GetOptions{})
	require.NoError(t, err)
	_, err = tlstest.Dial(addr, &tls.Config{RootCAs: tlstest.Pool(t, crd.Spec.Conversion.Webhook.ClientConfig.CABundle)})
	require.NoError(t, err, "the CRD's conversion caBundle verifies the served leaf")

	// (c) The kube-apiserver calls the webhook: a denied object is refused
	// with the webhook's message.
	_, err = client.CoreV1().ConfigMaps(testNS).Create(ctx, configMap("denied"), metav1.CreateOptions{})
	require.ErrorContains(t, err, "evercert test webhook denies denied")
	// It calls the conversion webhook: a widget stored as v1 read as v2.
	dyn := dynamic.NewForConfigOrDie(restConfig)
	_, err = dyn.Resource(widgetsV2.GroupResource().WithVersion("v1")).Namespace(testNS).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": crdGroup + "/v1", "kind": "Widget", "metadata": map[string]any{"name": "w"}, "spec": map[string]any{"size": int64(1)},
	}}, metav1.CreateOptions{})
	require.NoError(t, err)
	w, err := dyn.Resource(widgetsV2).Namespace(testNS).Get(ctx, "w", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, crdGroup+"/v2", w.GetAPIVersion())
	require.Positive(t, conversions.Load(), "the conversion webhook was not called")

	// (d) Calls keep succeeding through leaf and CA rotations. The loop
	// ends once leaves of three CAs have been served (two CA rotations)
	// and a call succeeded after each; the timeout is only a safety net.
	leaves, issuers := map[string]bool{}, map[string]bool{}
	var creates, reads, failures int
	deadline := time.Now().Add(3 * time.Minute)
	for len(issuers) < 3 && time.Now().Before(deadline) {
		creates++
		if _, err := client.CoreV1().ConfigMaps(testNS).Create(ctx, configMap(fmt.Sprintf("ok-%d", creates)), metav1.CreateOptions{}); err != nil {
			failures++
			t.Errorf("create %d: %v", creates, err)
		}
		reads++
		if _, err := dyn.Resource(widgetsV2).Namespace(testNS).Get(ctx, "w", metav1.GetOptions{}); err != nil {
			failures++
			t.Errorf("read %d as v2 (conversion): %v", reads, err)
		}
		cur, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwcName, metav1.GetOptions{})
		require.NoError(t, err)
		leaf, err := tlstest.Dial(addr, &tls.Config{RootCAs: tlstest.Pool(t, cur.Webhooks[0].ClientConfig.CABundle)})
		if err != nil {
			failures++
			t.Errorf("handshake with the caBundle published: %v", err)
			continue
		}
		leaves[leaf.SerialNumber.String()] = true
		issuers[hex.EncodeToString(leaf.AuthorityKeyId)] = true
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d creates, %d reads as v2, %d failures, %d admission calls, %d conversion calls, %d leaves served, signed by %d CAs",
		creates, reads, failures, calls.Load(), conversions.Load(), len(leaves), len(issuers))
	assert.Zero(t, failures)
	assert.GreaterOrEqual(t, len(leaves), 3, "leaf rotations")
	assert.GreaterOrEqual(t, len(issuers), 3, "CA rotations")
	assert.GreaterOrEqual(t, calls.Load(), int64(creates), "the kube-apiserver called the webhook for every create")
	assert.GreaterOrEqual(t, conversions.Load(), int64(reads), "the kube-apiserver called the conversion webhook for every read")

	// (f) All of it ran on a replica that never led.
	select {
	case <-mgr.Elected():
		t.Fatal("the manager was elected although another holder keeps the Lease")
	default:
	}
}

func validatingConfig(port int) *admissionregistrationv1.ValidatingWebhookConfiguration {
	url := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + webhookPath
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: vwcName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "validate.evercert.test",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{selectorLabel: "yes"}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
}

func configMap(name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{selectorLabel: "yes"}}}
}

func get(url string) (int, string, error) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func containsAll(bundle, want []*x509.Certificate) bool {
	for _, w := range want {
		found := false
		for _, b := range bundle {
			found = found || b.Equal(w)
		}
		if !found {
			return false
		}
	}
	return true
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
