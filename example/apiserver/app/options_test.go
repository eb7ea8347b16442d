package app_test

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/example/apiserver/app"
)

func TestOptionsAggregationFlags(t *testing.T) {
	parse := func(args ...string) (*app.Options, error) {
		o := app.NewOptions()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o.AddFlags(fs)
		require.NoError(t, fs.Parse(args))
		return o, o.Validate()
	}

	o, err := parse()
	require.NoError(t, err)
	assert.False(t, o.Delegated())
	assert.False(t, o.Registers())
	assert.Equal(t, 30*24*time.Hour, o.SelfSignedValidity)
	assert.EqualValues(t, 443, o.APIServicePort)
	assert.Equal(t, []string{"localhost", "127.0.0.1", "::1"}, o.SelfSignedHosts)

	o, err = parse("--kubeconfig=/k", "--apiservice-service=evercert/example", "--self-signed-validity=4s", "--self-signed-renew-before=1s", "--apiservice-port=8443")
	require.NoError(t, err)
	assert.True(t, o.Delegated())
	assert.True(t, o.Registers())
	assert.Equal(t, 4*time.Second, o.SelfSignedValidity)
	assert.Equal(t, time.Second, o.SelfSignedRenewBefore)
	assert.EqualValues(t, 8443, o.APIServicePort)
	ns, name, err := o.APIServiceServiceRef()
	require.NoError(t, err)
	assert.Equal(t, "evercert", ns)
	assert.Equal(t, "example", name)

	o, err = parse("--kubeconfig=/k")
	require.NoError(t, err, "delegation without registration")
	assert.False(t, o.Registers())

	for _, bad := range [][]string{
		{"--apiservice-service=a/b"},
		{"--requestheader-client-ca-file=/ca"},
		{"--authentication-kubeconfig=/k"},
		{"--kubeconfig=/k", "--apiservice-service=noslash"},
		{"--kubeconfig=/k", "--apiservice-service=a/b/c"},
		{"--kubeconfig=/k", "--apiservice-service=a/B"},
		{"--kubeconfig=/k", "--apiservice-service=a/b", "--apiservice-port=0"},
		{"--kubeconfig=/k", "--apiservice-service=a/b", "--tls-cert-file=/c", "--tls-private-key-file=/k"},
		{"--kubeconfig=/k", "--apiservice-service=a/b", "--apiservice-ca-file=/ca"},
		{"--kubeconfig=/k", "--apiservice-ca-file=/ca"},
		{"--self-signed-validity=500ms"},
		{"--self-signed-validity=4s", "--self-signed-renew-before=4s"},
		{"--self-signed-renew-before=-1s"},
	} {
		_, err := parse(bad...)
		assert.Error(t, err, "%v", bad)
	}
	_, err = parse("--kubeconfig=/k", "--apiservice-service=a/b", "--tls-cert-file=/c", "--tls-private-key-file=/k", "--apiservice-ca-file=/ca")
	assert.NoError(t, err, "certificate files with a CA bundle file to publish")
}

// TestOptionsSelfSignedHosts: --self-signed-hosts accepts DNS names,
// wildcards and IPs and refuses a host with a port, naming the flag and
// the value (issue 27; before, it became a SAN no client verifies).
func TestOptionsSelfSignedHosts(t *testing.T) {
	parse := func(args ...string) error {
		o := app.NewOptions()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o.AddFlags(fs)
		require.NoError(t, fs.Parse(args))
		return o.Validate()
	}
	require.NoError(t, parse("--self-signed-hosts=api.example.test,*.example.test,10.0.0.1"))
	err := parse("--self-signed-hosts=api.example.test:443")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `--self-signed-hosts[0]: "api.example.test:443" is a host and a port`)
}
