// Package controllerruntime proves the README's controller-runtime recipe
// against a real sigs.k8s.io/controller-runtime webhook.Server: evercert
// supplies only the certificate, and the framework's mTLS (ClientCAName),
// TLS version floor and HTTP/2-off stay in force while the certificate and
// its CA rotate.
package controllerruntime

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/rotationtest"
	"github.com/evercert/evercert/sni"
)

// newWebhookServer is the README recipe ("controller-runtime's webhook
// server"), word for word; the test adds only Host and Port. The framework
// owns the tls.Config: kubebuilder's scaffold switches HTTP/2 off and sets
// the version floor through TLSOpts, ClientCAName makes controller-runtime
// require client certificates, and evercert contributes only
// GetCertificate.
func newWebhookServer(ctrl *sni.DynamicServingCertificateController, host string, port int, certDir string) webhook.Server {
	disableHTTP2 := func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} } // kubebuilder's default
	return webhook.NewServer(webhook.Options{
		Host: host, Port: port, // test only
		CertDir:      certDir,         // holds only the client CA: evercert serves the certificate
		ClientCAName: "client-ca.crt", // mTLS: the API server's client certificate is required
		TLSOpts: []func(*tls.Config){
			disableHTTP2,
			func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 },
			ctrl.SetGetCertificate, // sets GetCertificate, nothing else
		},
	})
}

const webhookName = "webhook.evercert.test"

// TestControllerRuntimeRecipe runs a real controller-runtime webhook.Server
// built by the recipe, with evercert's sni controller serving a
// self-signed provider on a fake clock (their real Run loops rotate), and
// sends it real AdmissionReviews the way the API server does: over mTLS,
// trusting the CA bundle evercert publishes (the caBundle).
//
// It shows that a client without a certificate and a TLS 1.2 client are
// refused, that HTTP/2 is not negotiated, and that AdmissionReviews keep
// passing through leaf rotations and CA rotations, both with the bundle
// read at each request and with the bundle read one step earlier.
func TestControllerRuntimeRecipe(t *testing.T) {
	ctrllog.SetLogger(klog.Background())
	ctx, cancel := context.WithCancel(context.Background())
	clk := clocktesting.NewFakeClock(time.Now())

	// Leaves live an hour and renew with 20 minutes left; CAs live three
	// hours, a successor is published an hour before the signing CA
	// expires and signs 10 minutes later (the propagation delay).
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Name: "webhook", Hosts: []string{webhookName}, Lifetime: time.Hour, Clock: clk,
	})
	require.NoError(t, err)
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: serving, Clock: clk})
	require.NoError(t, err)
	require.NoError(t, ctrl.RunOnce(ctx))
	var loops []chan struct{}
	for _, run := range []func(context.Context, int){serving.Run, ctrl.Run} {
		done := make(chan struct{})
		loops = append(loops, done)
		go func() { defer close(done); run(ctx, 1) }()
	}

	// The client CA the framework verifies the API server's certificate
	// against, in CertDir as ClientCAName.
	certDir := t.TempDir()
	clientCA, err := pki.NewCA(pki.Request{CommonName: "apiserver-client-ca", Now: time.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(certDir, "client-ca.crt"), clientCA.CertPEM, 0o600))
	apiserver, err := pki.IssueLeaf(clientCA, pki.Request{CommonName: "kube-apiserver", Now: time.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	clientCert, err := tls.X509KeyPair(apiserver.CertPEM, apiserver.KeyPEM)
	require.NoError(t, err)

	port := freePort(t)
	srv := newWebhookServer(ctrl, "127.0.0.1", port, certDir)
	srv.Register("/validate", &webhook.Admission{Handler: admission.HandlerFunc(
		func(_ context.Context, req admission.Request) admission.Response {
			return admission.Allowed("checked by " + req.Name)
		})})
	served := make(chan error, 1)
	go func() { served <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("webhook server did not stop")
		}
		for _, done := range loops {
			<-done
		}
	})
	url := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/validate"

	// client is the API server calling the webhook: it trusts bundle (the
	// caBundle), checks the certificate on the fake clock and offers
	// HTTP/2 first, as the API server does.
	client := func(bundle []byte, mutate ...func(*tls.Config)) *http.Client {
		roots := x509.NewCertPool()
		require.True(t, roots.AppendCertsFromPEM(bundle))
		cfg := &tls.Config{
			RootCAs: roots, ServerName: webhookName, Time: clk.Now,
			Certificates: []tls.Certificate{clientCert}, NextProtos: []string{"h2", "http/1.1"},
		}
		for _, m := range mutate {
			m(cfg)
		}
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
	}
	require.Eventually(t, func() bool {
		_, err := review(client(serving.CurrentCABundleContent()), url, "startup")
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the webhook server does not answer")

	resp, err := review(client(serving.CurrentCABundleContent()), url, "first")
	require.NoError(t, err)
	assert.Equal(t, "HTTP/1.1", resp.Proto, "HTTP/2 is off")
	assert.Equal(t, "http/1.1", resp.TLS.NegotiatedProtocol)
	assert.Equal(t, uint16(tls.VersionTLS13), resp.TLS.Version)

	_, err = review(client(serving.CurrentCABundleContent(), func(c *tls.Config) { c.Certificates = nil }), url, "no-cert")
	require.Error(t, err, "a client without a certificate must be refused: ClientCAName is set")
	_, err = review(client(serving.CurrentCABundleContent(), func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }), url, "tls12")
	require.ErrorContains(t, err, "protocol version not supported", "a TLS 1.2 client must be refused: the framework's floor is TLS 1.3")

	// Step the fake clock through 9 hours in 10-minute steps; the
	// provider's and the controller's Run loops rotate. After each step,
	// wait until the renewed leaf is served, then review.
	leaves, cas := map[string]bool{}, map[string]bool{}
	previous := serving.CurrentCABundleContent()
	for step := range 54 {
		clk.Step(10 * time.Minute)
		var leaf *x509.Certificate
		require.Eventually(t, func() bool {
			// The leaf is read once the provider has settled: read
			// before, it could be the previous step's leaf, renewed
			// while settled looked, and still served by a controller
			// that had not rebuilt yet (failed once in CI).
			if !rotationtest.Settled(serving, clk.Now()) {
				return false
			}
			leaf = serving.Leaf()
			return rotationtest.DefaultServedSerial(ctrl) == leaf.SerialNumber.Text(16)
		}, 30*time.Second, 5*time.Millisecond, "step %d: the provider did not settle, or its leaf is not served", step)
		leaves[leaf.SerialNumber.Text(16)] = true
		cas[string(leaf.AuthorityKeyId)] = true

		current := serving.CurrentCABundleContent()
		for name, bundle := range map[string][]byte{"current": current, "previous": previous} {
			resp, err := review(client(bundle), url, fmt.Sprintf("step-%d-%s", step, name))
			require.NoError(t, err, "step %d, %s bundle", step, name)
			require.Equal(t, 0, resp.TLS.PeerCertificates[0].SerialNumber.Cmp(leaf.SerialNumber), "step %d: served leaf", step)
			require.Equal(t, "http/1.1", resp.TLS.NegotiatedProtocol)
		}
		previous = current
	}
	t.Logf("%d leaves, signed by %d CAs", len(leaves), len(cas))
	assert.GreaterOrEqual(t, len(leaves), 10, "leaf rotations")
	assert.GreaterOrEqual(t, len(cas), 3, "CA rotations")

	// Still mTLS after all of it.
	_, err = review(client(serving.CurrentCABundleContent(), func(c *tls.Config) { c.Certificates = nil }), url, "no-cert-after")
	require.Error(t, err)
}

// review POSTs an AdmissionReview for an object named name and checks the
// answer: the request's UID, allowed, and the handler's message.
func review(c *http.Client, url, name string) (*http.Response, error) {
	uid := types.UID("uid-" + name)
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: uid, Name: name, Namespace: "default", Operation: admissionv1.Create,
			Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		},
	})
	if err != nil {
		return nil, err
	}
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, data)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("decoding the response: %w", err)
	}
	switch r := out.Response; {
	case r == nil:
		return nil, errors.New("no response in the AdmissionReview")
	case r.UID != uid:
		return nil, fmt.Errorf("response UID %q, want %q", r.UID, uid)
	case !r.Allowed || r.Result == nil || r.Result.Message != "checked by "+name:
		return nil, fmt.Errorf("unexpected response %+v", r)
	}
	return resp, nil
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
