package podcert

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/evercert/evercert/authority"
)

// TestNewRefusesBadConfig: every bad field is reported at once, by name.
func TestNewRefusesBadConfig(t *testing.T) {
	_, err := NewSigner(SignerConfig{})
	require.Error(t, err)
	for _, field := range []string{"SignerConfig.SignerName", "SignerConfig.CA", "SignerConfig.Client", "SignerConfig.Policy"} {
		assert.Contains(t, err.Error(), field)
	}

	e := newEnv(t)
	ok := SignerConfig{SignerName: testSigner, CA: e.ca, Client: fake.NewClientset(), Policy: webPolicy}
	for field, mutate := range map[string]func(*SignerConfig){
		"SignerConfig.SignerName": func(c *SignerConfig) { c.SignerName = "kubernetes.io/kube-apiserver-client-pod" },
		"SignerConfig.KeyTypes":   func(c *SignerConfig) { c.KeyTypes = []string{"RSA1024"} },
		"SignerConfig.MaxLifetime": func(c *SignerConfig) {
			c.MaxLifetime = 30 * time.Minute
		},
		"SignerConfig.Backdate": func(c *SignerConfig) { c.Backdate = 5 * time.Minute },
	} {
		c := ok
		mutate(&c)
		_, err := NewSigner(c)
		assert.ErrorContains(t, err, field)
	}
	c := ok
	c.KeyTypes = []string{}
	_, err = NewSigner(c)
	assert.ErrorContains(t, err, "SignerConfig.KeyTypes", "an empty list would deny everything")
	_, err = NewSigner(ok)
	assert.NoError(t, err)
}

func TestCheckSignerName(t *testing.T) {
	for _, good := range []string{"evercert.io/serving", "example.com/a/b"} {
		assert.NoError(t, ValidateSignerName(good), good)
	}
	for _, bad := range []string{"", "serving", "evercert.io/", "localhost/serving", "kubernetes.io/x", "foo.kubernetes.io/x", "Bad_Domain.io/x"} {
		assert.Error(t, ValidateSignerName(bad), bad)
	}
}

// TestParsePolicy: the documented YAML parses; a misspelt field, a rule
// that grants nothing and bad names are errors naming the field.
func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]byte(`
clusterDomain: corp.local
rules:
- namespace: apps
  serviceAccounts: [web]
  serviceNames: true
  dnsNames: ["web.example.com", "*.web.example.com"]
- namespace: "*"
  dnsNames: [shared.example.com]
`))
	require.NoError(t, err)
	assert.Equal(t, "corp.local", p.clusterDomain())
	assert.Len(t, p.matching("apps", "web"), 2)
	assert.Len(t, p.matching("apps", "other"), 1)
	assert.Empty(t, (&Policy{Rules: []Rule{{Namespace: "apps", DNSNames: []string{"x.example.com"}}}}).matching("other", "web"))

	for doc, field := range map[string]string{
		"rules: [{namespace: apps, serviceName: true}]":                          "serviceName",
		"rules: [{namespace: apps}]":                                             "policy.rules[0]: grants no name",
		"rules: []":                                                              "policy.rules: at least one rule",
		"rules: [{serviceNames: true}]":                                          "policy.rules[0].namespace",
		"rules: [{namespace: Apps, serviceNames: true}]":                         "policy.rules[0].namespace",
		"rules: [{namespace: a, dnsNames: [ok.io, 'bad name']}]":                 "policy.rules[0].dnsNames[1]",
		"rules: [{namespace: a, dnsNames: ['*.*.io']}]":                          "policy.rules[0].dnsNames[0]",
		"rules: [{namespace: a, serviceAccounts: [X], dnsNames: [a.io]}]":        "policy.rules[0].serviceAccounts[0]",
		"clusterDomain: 'bad domain'\nrules: [{namespace: a, dnsNames: [a.io]}]": "policy.clusterDomain",
	} {
		_, err := ParsePolicy([]byte(doc))
		assert.ErrorContains(t, err, field, doc)
	}
}

// TestServiceNames: a Service selects a pod when its whole selector matches
// the pod's labels; one without a selector selects nothing.
func TestServiceNames(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Labels: map[string]string{"app": "web", "tier": "front"}}}
	svc := func(name string, sel map[string]string) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name}, Spec: corev1.ServiceSpec{Selector: sel}}
	}
	got := serviceNames(pod, []corev1.Service{
		svc("web", map[string]string{"app": "web"}),
		svc("both", map[string]string{"app": "web", "tier": "front"}),
		svc("back", map[string]string{"app": "web", "tier": "back"}),
		svc("manual", nil),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "external"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "web.example.com", Selector: map[string]string{"app": "web"}}},
	}, "cluster.local")
	assert.Equal(t, []string{"web.apps.svc", "web.apps.svc.cluster.local", "both.apps.svc", "both.apps.svc.cluster.local"}, got)
}

// TestBeginRefreshAt: two thirds into the leaf's life, and at least 10
// minutes from either end, whatever the lifetime.
func TestBeginRefreshAt(t *testing.T) {
	nb := testNow
	for life, want := range map[time.Duration]time.Duration{
		24 * time.Hour:            16 * time.Hour,
		time.Hour:                 40 * time.Minute,
		25 * time.Minute:          15 * time.Minute, // 16m40s, clamped to NotAfter-10m
		20 * time.Minute:          10 * time.Minute,
		3*time.Hour + time.Second: 2 * time.Hour, // truncated to whole seconds
	} {
		leaf := &x509.Certificate{NotBefore: nb, NotAfter: nb.Add(life)}
		assert.Equal(t, nb.Add(want), beginRefreshAt(leaf), "lifetime %v", life)
	}
}

func TestRedactPEM(t *testing.T) {
	msg := "status.certificateChain: Invalid value: \"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n\": bad"
	got := redactPEM(msg)
	assert.NotContains(t, got, "MIIB")
	assert.NotContains(t, got, "MIIC")
	assert.Contains(t, got, "status.certificateChain: Invalid value")
	assert.Contains(t, got, ": bad")
}

// TestNewRefusesCAThatNeverCoversMinLifetime: an Authority whose CAs, once
// rotating, can never give a leaf the API's minimum of one hour (CA
// lifetime minus propagation delay plus backdate, less a second of
// rounding) is refused at once, with the numbers; one second more is
// accepted.
func TestNewRefusesCAThatNeverCoversMinLifetime(t *testing.T) {
	e := newEnv(t)
	authority := func(caLifetime time.Duration) *authority.Authority {
		a, err := authority.New(authority.Config{
			Namespace: "evercert", SecretName: "short-ca", Client: e.api, Hosts: []string{"signer.evercert.svc"},
			Lifetime: 6 * time.Minute, CALifetime: caLifetime, CARenewBefore: 10 * time.Minute, Clock: e.clk,
		})
		require.NoError(t, err)
		return a
	}
	cfg := func(ca LeafSigner) SignerConfig {
		return SignerConfig{SignerName: testSigner, CA: ca, Client: e.api, Policy: webPolicy, Clock: e.clk}
	}

	short := authority(30 * time.Minute) // propagation (10m-2m)/4 = 2m: at most 30m-2m+2m-1s
	_, err := NewSigner(cfg(short))
	require.ErrorIs(t, err, ErrCANeverCoversMinLifetime)
	assert.ErrorContains(t, err, "SignerConfig.CA")
	assert.ErrorContains(t, err, "leaves at most 29m59s")
	sched, ok := caSchedule(short)
	require.True(t, ok)
	assert.Equal(t, 29*time.Minute+59*time.Second, sched.LongestLeaf(DefaultBackdate))

	// 1h plus propagation minus backdate plus the rounding second.
	_, err = NewSigner(cfg(authority(time.Hour + 2*time.Minute - DefaultBackdate + time.Second)))
	require.NoError(t, err)
	_, err = NewSigner(cfg(authority(time.Hour + 2*time.Minute - DefaultBackdate)))
	require.ErrorIs(t, err, ErrCANeverCoversMinLifetime)
}
