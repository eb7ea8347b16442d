package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
)

func parse(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	return o, errors.Join(o.Validate()...)
}

func TestDefaultsValidate(t *testing.T) {
	o, err := parse(t)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", o.BindAddress.String())
	assert.Equal(t, 8443, o.SecurePort)
	assert.True(t, o.usesSelfSigned(), "no certificate flag: the embedded self-signed default")
	assert.Equal(t, []string{"localhost", "127.0.0.1", "::1"}, o.SelfSignedHosts)
}

func TestFlagParsing(t *testing.T) {
	o, err := parse(t,
		"--bind-address=::1", "--secure-port=0",
		"--tls-cert-file=a.crt", "--tls-private-key-file=a.key",
		"--tls-sni-cert-key=b.crt,b.key", "--tls-sni-cert-key=c.crt,c.key:*.c.test,c.test",
		"--client-ca-file=ca.crt", "--tls-min-version=VersionTLS13",
		"--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
	)
	require.NoError(t, err)
	assert.Equal(t, "::1", o.BindAddress.String())
	assert.Zero(t, o.SecurePort)
	require.Len(t, o.SNICertKeys, 2)
	assert.Equal(t, "b.crt", o.SNICertKeys[0].CertFile)
	assert.Empty(t, o.SNICertKeys[0].Names)
	assert.Equal(t, []string{"*.c.test", "c.test"}, o.SNICertKeys[1].Names)
	assert.False(t, o.usesSelfSigned())

	o, err = parse(t, "--ca-secret=ns/ca", "--kubeconfig=kc", "--ca-bundle-file=b.pem", "--self-signed-validity=10s")
	require.NoError(t, err)
	assert.Equal(t, "ns/ca", o.CASecret)
}

// TestBadFlagValues checks that every bad value is rejected with a message
// naming its flag.
func TestBadFlagValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--bind-address=nope"}, "--bind-address"},
		{[]string{"--secure-port=70000"}, "--secure-port"},
		{[]string{"--secure-port=-1"}, "--secure-port"},
		{[]string{"--tls-cert-file=a.crt"}, "--tls-private-key-file"},
		{[]string{"--tls-private-key-file=a.key"}, "--tls-cert-file"},
		{[]string{"--tls-sni-cert-key=a.crt"}, "--tls-sni-cert-key"},
		{[]string{"--tls-min-version=VersionSSL30"}, "--tls-min-version"},
		{[]string{"--tls-cipher-suites=TLS_FAKE"}, "--tls-cipher-suites"},
		{[]string{"--tls-cipher-suites=TLS_RSA_WITH_RC4_128_SHA"}, "--tls-cipher-suites"},
		{[]string{"--self-signed-hosts="}, "--self-signed-hosts"},
		{[]string{"--self-signed-validity=0s"}, "--self-signed-validity"},
		{[]string{"--self-signed-validity=999ms"}, "--self-signed-validity: 999ms must be at least 1s"},
		{[]string{"--self-signed-validity=1h", "--self-signed-renew-before=2h"}, "--self-signed-renew-before"},
		{[]string{"--self-signed-validity=bogus"}, "--self-signed-validity"},
		{[]string{"--tls-cert-file=a", "--tls-private-key-file=b", "--ca-bundle-file=x"}, "--ca-bundle-file"},
		{[]string{"--tls-secret=noslash"}, "--tls-secret"},
		{[]string{"--ca-secret=ns/"}, "--ca-secret"},
		{[]string{"--tls-secret=a/b", "--ca-secret=a/c"}, "--ca-secret, --tls-secret"},
		{[]string{"--kubeconfig=kc"}, "--kubeconfig"},
		{[]string{"--shutdown-timeout=0s"}, "--shutdown-timeout"},
		{[]string{"--shutdown-timeout=-1s"}, "--shutdown-timeout"},
		{[]string{"--self-signed-key-types=ecdsa-p256,dsa-1024"}, "--self-signed-key-types"},
		{[]string{"--self-signed-key-types=rsa-2048,RSA-2048"}, "--self-signed-key-types"},
		{[]string{"--self-signed-key-types="}, "--self-signed-key-types"},
		{[]string{"--tls-cert-file=a", "--tls-private-key-file=b", "--self-signed-key-types=ecdsa-p256,rsa-2048"}, "--self-signed-key-types"},
		// Hosts that would become SANs no client verifies (issue 27).
		{[]string{"--self-signed-hosts=host:443"}, `--self-signed-hosts[0]: "host:443" is a host and a port`},
		{[]string{"--self-signed-hosts=https://host"}, `--self-signed-hosts[0]: "https://host" is a URL`},
		{[]string{"--self-signed-hosts=a, b"}, `--self-signed-hosts[1]: " b" is several names or spaces`},
		{[]string{"--self-signed-hosts=10.0.0.1/32"}, `--self-signed-hosts[0]: "10.0.0.1/32" is a network (CIDR)`},
		{[]string{"--ca-secret=ns/ca", "--self-signed-hosts=webhook.ns.svc,webhook.ns.svc:443"}, `--self-signed-hosts[1]: "webhook.ns.svc:443"`},
		{[]string{"--tls-sni-cert-key=a.crt,a.key:a.test,10.0.0.0/8"}, `--tls-sni-cert-key[0] names[1]: "10.0.0.0/8"`},
		// Lifetimes whose CA lifetime overflowed (issue 27).
		{[]string{"--ca-secret=ns/ca", "--self-signed-validity=350400h"}, "--self-signed-validity: 350400h0m0s must be at most 219000h0m0s without --ca-validity: the CA of --ca-secret then lives 8 times as long, at most 1752000h0m0s"},
		{[]string{"--self-signed-validity=876000h"}, "--self-signed-validity: 876000h0m0s must be at most 584000h0m0s without --ca-validity"},
		{[]string{"--self-signed-validity=2000000h", "--ca-validity=1000000h"}, "--self-signed-validity: 2000000h0m0s must be at most 1752000h0m0s"},
		{[]string{"--ca-validity=2000000h"}, "--ca-validity: 2000000h0m0s must be at most 1752000h0m0s"},
		{[]string{"--ca-secret=ns/ca", "--startup-timeout=0s"}, "--startup-timeout: 0s must be positive"},
		{[]string{"--startup-timeout=1m"}, "--startup-timeout: only used with --tls-secret or --ca-secret"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parse(t, tc.args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.flag)
		})
	}
}

func TestBuildErrorsNameTheFlag(t *testing.T) {
	o, err := parse(t, "--tls-secret=ns/name", "--kubeconfig=/nonexistent/kubeconfig")
	require.NoError(t, err)
	_, err = o.Build()
	require.ErrorContains(t, err, "--kubeconfig")
}

func TestCAScheduleFlags(t *testing.T) {
	o := NewOptions()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--self-signed-validity=1h", "--ca-validity=10h", "--ca-renew-before=3h", "--ca-propagation-delay=5m", "--clock-skew-tolerance=30m"}))
	require.Empty(t, o.Validate())
	s, err := o.Build()
	require.NoError(t, err)
	cfg := s.TrustBundle.(*authority.SelfSigned).Config()
	require.Equal(t, 10*time.Hour, cfg.CALifetime)
	require.Equal(t, 3*time.Hour, cfg.CARenewBefore)
	require.Equal(t, 5*time.Minute, cfg.PropagationDelay)
	require.Equal(t, 30*time.Minute, cfg.SkewTolerance)

	bad := NewOptions()
	bad.CAPropagationDelay = 100 * 24 * time.Hour
	_, err = bad.Build()
	require.ErrorContains(t, err, "--ca-propagation-delay")
	require.ErrorContains(t, err, "propagation delay")

	files := NewOptions()
	files.CertFile, files.KeyFile, files.CAValidity = "a", "b", time.Hour
	require.ErrorContains(t, errors.Join(files.Validate()...), "--ca-validity: only used with the self-signed default or --ca-secret")
}

// TestSelfSignedKeyTypesFlag: --self-signed-key-types reaches the
// self-signed default and --ca-secret's Authority, in order.
func TestSelfSignedKeyTypesFlag(t *testing.T) {
	o, err := parse(t, "--self-signed-key-types=ecdsa-p256,RSA-2048")
	require.NoError(t, err)
	s, err := o.Build()
	require.NoError(t, err)
	ss := s.TrustBundle.(*authority.SelfSigned)
	assert.Equal(t, []dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA2048}, ss.Config().KeyTypes)
	require.Len(t, ss.Alternatives(), 1)
	assert.Equal(t, "self-signed/rsa-2048", ss.Alternatives()[0].Name())

	o, err = parse(t, "--ca-secret=ns/ca", "--kubeconfig="+writeKubeconfig(t), "--self-signed-key-types=rsa-3072,ecdsa-p384")
	require.NoError(t, err)
	s, err = o.Build()
	require.NoError(t, err)
	a := s.TrustBundle.(*authority.Authority)
	require.Len(t, a.Alternatives(), 1)
	assert.Equal(t, "ca-secret/ecdsa-p384", a.Alternatives()[0].Name())

	o, err = parse(t)
	require.NoError(t, err)
	assert.Equal(t, []string{"ecdsa-p256"}, o.SelfSignedKeyTypes)
}

// writeKubeconfig writes a kubeconfig for a server that is never contacted:
// Build makes clients, only Run uses them.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	return path
}

// TestHostsAndLifetimeFlagsAccepted: DNS names, wildcards and IPs pass,
// and a leaf of 40 years with --ca-secret builds once --ca-validity is
// set (without it the 8 × default used to overflow into "lifetimes must be
// positive", now refused by Validate naming the flag).
func TestHostsAndLifetimeFlagsAccepted(t *testing.T) {
	o, err := parse(t, "--self-signed-hosts=*.example.com,Example.com,10.0.0.1,::1")
	require.NoError(t, err)
	_, err = o.Build()
	require.NoError(t, err)

	o, err = parse(t, "--ca-secret=ns/ca", "--kubeconfig="+writeKubeconfig(t), "--self-signed-validity=350400h", "--ca-validity=1000000h")
	require.NoError(t, err)
	s, err := o.Build()
	require.NoError(t, err)
	assert.Equal(t, 1000000*time.Hour, s.TrustBundle.(*authority.Authority).Config().CALifetime)

	o, err = parse(t, "--ca-secret=ns/ca", "--kubeconfig="+writeKubeconfig(t), "--self-signed-validity=219000h")
	require.NoError(t, err, "the longest leaf with --ca-secret's default CA lifetime")
	_, err = o.Build()
	require.NoError(t, err)
}

// TestReplicaIDFlag: --replica-id names the --ca-secret Authority's replica
// and defaults to $POD_NAME, so a process restarted in its pod announces
// itself under the same ID (issue 27); without --ca-secret an explicit
// value is refused, naming the flag.
func TestReplicaIDFlag(t *testing.T) {
	t.Setenv(authority.PodNameEnv, "webhook-7d9f8-x2k4q")
	kubeconfig := writeKubeconfig(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "webhook-7d9f8-x2k4q"},
		{[]string{"--replica-id=webhook-0"}, "webhook-0"},
	} {
		o, err := parse(t, append([]string{"--ca-secret=ns/ca", "--kubeconfig=" + kubeconfig}, tc.args...)...)
		require.NoError(t, err)
		s, err := o.Build()
		require.NoError(t, err)
		require.Equal(t, tc.want, s.Serving.(*authority.Authority).ReplicaID(), "%v", tc.args)
	}
	_, err := parse(t) // the $POD_NAME default alone is no error
	require.NoError(t, err)
	_, err = parse(t, "--replica-id=webhook-0")
	require.ErrorContains(t, err, "--replica-id: only used with --ca-secret")
}
