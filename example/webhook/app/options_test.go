package app

import (
	"errors"
	"net"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func parse(t *testing.T, args ...string) *Options {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	require.NoError(t, fs.Parse(args))
	return o
}

func TestOptionsDefaults(t *testing.T) {
	o := parse(t, "--ca-secret=ns/ca")
	assert.Empty(t, o.Validate())
	assert.Equal(t, DefaultConfigurationName, o.ValidatingWebhookConfiguration)
	assert.Equal(t, DefaultConfigurationName, o.MutatingWebhookConfiguration)
	svc, err := o.serviceRef()
	require.NoError(t, err)
	assert.Nil(t, svc)
}

func TestOptionsValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"ca secret required":    {args: nil, want: "--ca-secret: required"},
		"no configuration":      {args: []string{"--ca-secret=ns/ca", "--validating-webhook-configuration=", "--mutating-webhook-configuration="}, want: "at least one must be set"},
		"bad configuration":     {args: []string{"--ca-secret=ns/ca", "--mutating-webhook-configuration=Bad_Name"}, want: "--mutating-webhook-configuration"},
		"bad service":           {args: []string{"--ca-secret=ns/ca", "--webhook-service=nope"}, want: "--webhook-service"},
		"bad service name":      {args: []string{"--ca-secret=ns/ca", "--webhook-service=ns/1svc"}, want: "--webhook-service"},
		"service with register": {args: []string{"--ca-secret=ns/ca", "--webhook-service=ns/svc", "--register-url=https://127.0.0.1"}, want: "mutually exclusive"},
		"http register url":     {args: []string{"--ca-secret=ns/ca", "--register-url=http://127.0.0.1"}, want: "scheme must be https"},
		"register url path":     {args: []string{"--ca-secret=ns/ca", "--register-url=https://127.0.0.1/x"}, want: "only https://HOST[:PORT]"},
		"register url port 0":   {args: []string{"--ca-secret=ns/ca", "--register-url=https://127.0.0.1:0"}, want: "invalid port"},
		"register url no host":  {args: []string{"--ca-secret=ns/ca", "--register-url=https://:8443"}, want: "a host is required"},
		"bad namespace":         {args: []string{"--ca-secret=ns/ca", "--target-namespace=Not_A_Namespace"}, want: "--target-namespace"},
		"server flags too":      {args: []string{"--ca-secret=ns/ca", "--secure-port=70000"}, want: "--secure-port"},
	} {
		t.Run(name, func(t *testing.T) {
			assert.ErrorContains(t, errors.Join(parse(t, tc.args...).Validate()...), tc.want)
		})
	}
	o := parse(t, "--ca-secret=ns/ca", "--webhook-service=ns/svc", "--validating-webhook-configuration=", "--target-namespace=team")
	assert.Empty(t, o.Validate())
	svc, err := o.serviceRef()
	require.NoError(t, err)
	assert.Equal(t, "ns/svc", svc.String())
}

func TestRegisterBase(t *testing.T) {
	addr := &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 4321}
	for raw, want := range map[string]string{
		"https://127.0.0.1":         "https://127.0.0.1:4321",
		"https://127.0.0.1/":        "https://127.0.0.1:4321",
		"https://localhost:9443":    "https://localhost:9443",
		"https://[::1]":             "https://[::1]:4321",
		"https://webhook.test:8443": "https://webhook.test:8443",
	} {
		o := parse(t, "--ca-secret=ns/ca", "--register-url="+raw)
		require.Empty(t, o.Validate(), raw)
		got, err := o.registerBase(addr)
		require.NoError(t, err, raw)
		assert.Equal(t, want, got, raw)
	}
}
