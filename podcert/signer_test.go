package podcert

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/tlstest"
)

// webPolicy grants the web service account its Service names and one
// static name, in namespace apps.
var webPolicy = Policy{Rules: []Rule{
	{Namespace: testNS, ServiceAccounts: []string{"web"}, ServiceNames: true, DNSNames: []string{"web.example.com"}},
	{Namespace: testNS, ServiceAccounts: []string{"static"}, DNSNames: []string{"static.example.com"}},
	{Namespace: testNS, ServiceAccounts: []string{"svc-only"}, ServiceNames: true},
}}

// parseBundle splits a credential bundle as a pod reads it: the key, then
// the chain.
func parseBundle(t *testing.T, bundle []byte) (tls.Certificate, []*x509.Certificate) {
	t.Helper()
	keyBlock, rest := pem.Decode(bundle)
	require.NotNil(t, keyBlock)
	require.Equal(t, "PRIVATE KEY", keyBlock.Type)
	var chain []*x509.Certificate
	var pair tls.Certificate
	for block, r := pem.Decode(rest); block != nil; block, r = pem.Decode(r) {
		require.Equal(t, "CERTIFICATE", block.Type)
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		chain = append(chain, c)
		pair.Certificate = append(pair.Certificate, block.Bytes)
	}
	key, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	require.NoError(t, err)
	pair.PrivateKey = key
	return pair, chain
}

// TestSignerIssuesPolicyNames: a webhook pod selected by two Services gets
// a leaf for exactly those Services' names and its static name, issued to
// its own key by the Authority's signing CA, with the status the API
// requires; the credential bundle the kubelet writes from it serves a real
// TLS handshake that verifies against the Authority's bundle for every
// name. Counted as issued, with its latency.
func TestSignerIssuesPolicyNames(t *testing.T) {
	e := newEnv(t)
	before := certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateIssued)
	e.signer(e.ca, webPolicy)
	pod := e.pod("web-1", "web", map[string]string{"app": "web", "tier": "front"})
	pcr, key := e.request(pod, KeyTypeECDSAP256)

	got := e.final(pcr)
	require.Len(t, got.Status.Conditions, 1)
	c := got.Status.Conditions[0]
	require.Equal(t, certificatesv1.PodCertificateRequestConditionTypeIssued, c.Type, c.Message)
	assert.Equal(t, ReasonIssued, c.Reason)

	pair, chain := parseBundle(t, credentialBundle(t, key, got.Status.CertificateChain))
	require.Len(t, chain, 1, "the chain is the leaf: clients trust the CA through the bundle")
	leaf := chain[0]
	assert.True(t, leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(key.Public()), "issued to the pod's key")
	want := []string{"web-headless.apps.svc", "web-headless.apps.svc.cluster.local", "web.apps.svc", "web.apps.svc.cluster.local", "web.example.com"}
	assert.Equal(t, want, leaf.DNSNames, "the selecting Services' names and the static name; not db's, not manual's")
	assert.Equal(t, e.ca.Status().Signing.Serial, signedBy(t, leaf, e.ca.CurrentCABundleContent()))

	// The status matches the leaf as the API requires.
	assert.Equal(t, leaf.NotBefore, got.Status.NotBefore.Time)
	assert.Equal(t, leaf.NotAfter, got.Status.NotAfter.Time)
	assert.Equal(t, e.clk.Now().Add(-DefaultBackdate), leaf.NotBefore, "backdated by DefaultBackdate")
	assert.Equal(t, 24*time.Hour, leaf.NotAfter.Sub(leaf.NotBefore), "maxExpirationSeconds 86400")
	assert.Equal(t, leaf.NotBefore.Add(16*time.Hour), got.Status.BeginRefreshAt.Time, "refresh at two thirds")

	for _, name := range want {
		addr := tlstest.Server(t, &tls.Config{Certificates: []tls.Certificate{pair}})
		_, err := tlstest.Handshake(addr, &tls.Config{ServerName: name, RootCAs: tlstest.Pool(t, e.ca.CurrentCABundleContent()), Time: e.clk.Now})
		require.NoError(t, err, name)
	}
	assert.Eventually(t, func() bool {
		return certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateIssued) == before+1
	}, guard, time.Millisecond, "counted as issued")
	assert.NotZero(t, certmetricstest.HistogramCount(t, "evercert_podcertificate_request_duration_seconds",
		map[string]string{"signer": testSigner, "result": certmetrics.PodCertificateIssued}))
	assert.Equal(t, 1, e.api.writes(pcr.Name), "one status write")
}

// signedBy returns the serial (hex) of the CA in bundle that signed leaf.
func signedBy(t *testing.T, leaf *x509.Certificate, bundle []byte) string {
	t.Helper()
	for rest := bundle; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		ca, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		if leaf.CheckSignatureFrom(ca) == nil {
			return ca.SerialNumber.Text(16)
		}
	}
	t.Fatalf("no CA in the bundle signed leaf %s", leaf.SerialNumber.Text(16))
	return ""
}

// TestSignerDeniesOutsidePolicy: every request the policy does not cover is
// Denied with a reason that says why (the kubelet reports it on the pod),
// counted, and sent as a Warning Event; none gets a certificate. Names the
// pod asks for within the policy narrow its certificate.
func TestSignerDeniesOutsidePolicy(t *testing.T) {
	e := newEnv(t)
	rec := recorder()
	e.signer(e.ca, webPolicy, func(c *SignerConfig) { c.EventRecorder = rec })
	web := e.pod("web-1", "web", map[string]string{"app": "web"})
	lonely := e.pod("lonely", "web", map[string]string{"app": "nothing-selects-me"})
	other := e.pod("other", "other-sa", map[string]string{"app": "web"})
	static := e.pod("static", "static", nil)
	unselected := e.pod("unselected", "svc-only", map[string]string{"app": "nothing-selects-me"})

	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		key    string
		mutate func(*certificatesv1.PodCertificateRequest)
		reason string
		detail string
	}{
		{name: "Ed25519 key", pod: web, key: KeyTypeED25519, reason: certificatesv1.PodCertificateRequestConditionUnsupportedKeyType, detail: "ECDSAP256"},
		{name: "unknown annotation", pod: web, key: KeyTypeECDSAP256, reason: certificatesv1.PodCertificateRequestConditionInvalidUserConfig, detail: "example.com/color",
			mutate: func(p *certificatesv1.PodCertificateRequest) {
				p.Spec.UnverifiedUserAnnotations = map[string]string{"example.com/color": "blue"}
			}},
		{name: "malformed names annotation", pod: web, key: KeyTypeECDSAP256, reason: certificatesv1.PodCertificateRequestConditionInvalidUserConfig, detail: DNSNamesAnnotation,
			mutate: func(p *certificatesv1.PodCertificateRequest) {
				p.Spec.UnverifiedUserAnnotations = map[string]string{DNSNamesAnnotation: "web.apps.svc,,"}
			}},
		{name: "name outside the policy", pod: web, key: KeyTypeECDSAP256, reason: ReasonDNSNameNotAllowed, detail: "db.apps.svc",
			mutate: func(p *certificatesv1.PodCertificateRequest) {
				p.Spec.UnverifiedUserAnnotations = map[string]string{DNSNamesAnnotation: "web.apps.svc,db.apps.svc"}
			}},
		{name: "service account not allowed", pod: other, key: KeyTypeECDSAP256, reason: ReasonNotAllowed, detail: "other-sa"},
		{name: "namespace not allowed", pod: web, key: KeyTypeECDSAP256, reason: ReasonNotAllowed, detail: "elsewhere",
			mutate: func(p *certificatesv1.PodCertificateRequest) { p.Namespace = "elsewhere" }},
		{name: "missing pod", pod: web, key: KeyTypeECDSAP256, reason: ReasonPodNotFound, detail: "web-gone",
			mutate: func(p *certificatesv1.PodCertificateRequest) { p.Spec.PodName = "web-gone" }},
		{name: "pod UID mismatch", pod: web, key: KeyTypeECDSAP256, reason: ReasonPodMismatch, detail: "uid-web-0",
			mutate: func(p *certificatesv1.PodCertificateRequest) { p.Spec.PodUID = types.UID("uid-web-0") }},
		{name: "pod on another node", pod: web, key: KeyTypeECDSAP256, reason: ReasonPodMismatch, detail: "node-2",
			mutate: func(p *certificatesv1.PodCertificateRequest) { p.Spec.NodeName = "node-2" }},
		{name: "pod runs as another service account", pod: static, key: KeyTypeECDSAP256, reason: ReasonPodMismatch, detail: "web",
			mutate: func(p *certificatesv1.PodCertificateRequest) { p.Spec.ServiceAccountName = "web" }},
		{name: "a Service name for a pod it does not select", pod: lonely, key: KeyTypeECDSAP256, reason: ReasonDNSNameNotAllowed, detail: "web.apps.svc",
			mutate: func(p *certificatesv1.PodCertificateRequest) {
				p.Spec.UnverifiedUserAnnotations = map[string]string{DNSNamesAnnotation: "web.apps.svc"}
			}},
		{name: "no name granted", pod: unselected, key: KeyTypeECDSAP256, reason: ReasonNoDNSNames, detail: "unselected"},
		{name: "maxExpirationSeconds below the API minimum", pod: web, key: KeyTypeECDSAP256, reason: ReasonInvalidRequest, detail: "maxExpirationSeconds",
			mutate: func(p *certificatesv1.PodCertificateRequest) { p.Spec.MaxExpirationSeconds = ptr.To[int32](600) }},
		{name: "unparsable CSR", pod: web, key: KeyTypeECDSAP256, reason: ReasonInvalidRequest, detail: "stubPKCS10Request",
			mutate: func(p *certificatesv1.PodCertificateRequest) { p.Spec.StubPKCS10Request = []byte("not a CSR") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateDenied)
			var mutate []func(*certificatesv1.PodCertificateRequest)
			if tc.mutate != nil {
				mutate = append(mutate, tc.mutate)
			}
			pcr, _ := e.request(tc.pod, tc.key, mutate...)
			got := e.final(pcr)
			require.Len(t, got.Status.Conditions, 1)
			c := got.Status.Conditions[0]
			assert.Equal(t, certificatesv1.PodCertificateRequestConditionTypeDenied, c.Type)
			assert.Equal(t, tc.reason, c.Reason, c.Message)
			assert.Contains(t, c.Message, tc.detail)
			assert.Empty(t, got.Status.CertificateChain)
			assert.Nil(t, got.Status.NotAfter)
			// Counted right after the write that the test just saw.
			assert.Eventually(t, func() bool {
				return certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateDenied) == before+1
			}, guard, time.Millisecond, "counted as denied")
			select {
			case ev := <-rec.Events:
				assert.Contains(t, ev, "Warning "+tc.reason)
			case <-time.After(guard):
				t.Fatal("no Event for the denial")
			}
		})
	}

	t.Run("names asked for within the policy", func(t *testing.T) {
		pcr, _ := e.request(web, KeyTypeRSA3072, func(p *certificatesv1.PodCertificateRequest) {
			p.Spec.UnverifiedUserAnnotations = map[string]string{DNSNamesAnnotation: " web.apps.svc , web.example.com"}
		})
		got := e.final(pcr)
		require.Equal(t, certificatesv1.PodCertificateRequestConditionTypeIssued, got.Status.Conditions[0].Type, got.Status.Conditions[0].Message)
		block, _ := pem.Decode([]byte(got.Status.CertificateChain))
		leaf, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		assert.Equal(t, []string{"web.apps.svc", "web.example.com"}, leaf.DNSNames)
	})
	t.Run("a rule with static names only", func(t *testing.T) {
		pcr, _ := e.request(static, KeyTypeECDSAP384)
		got := e.final(pcr)
		require.Equal(t, certificatesv1.PodCertificateRequestConditionTypeIssued, got.Status.Conditions[0].Type, got.Status.Conditions[0].Message)
		assert.True(t, strings.Contains(got.Status.Conditions[0].Message, "static.example.com"))
	})
}
