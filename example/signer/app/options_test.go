package app

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/podcert"
)

const examplePolicy = "../policy.yaml"

func parse(t *testing.T, args ...string) *Options {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	require.NoError(t, fs.Parse(args))
	return o
}

// TestExamplePolicy: example/signer/policy.yaml is a valid policy.
func TestExamplePolicy(t *testing.T) {
	o := parse(t, "--ca-secret=ns/ca", "--policy="+examplePolicy)
	assert.Empty(t, o.Validate())
	p, err := o.policy()
	require.NoError(t, err)
	assert.Len(t, p.Rules, 2)
	assert.Equal(t, DefaultSignerName, o.SignerName)
	assert.Equal(t, podcert.DefaultKeyTypes, o.KeyTypes)
	assert.Equal(t, 24*time.Hour, o.MaxLifetime)
}

func TestOptionsValidate(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("rules: [{namespace: apps, serviceName: true}]"), 0o600))
	ok := []string{"--ca-secret=ns/ca", "--policy=" + examplePolicy}
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"ca secret required":  {args: []string{"--policy=" + examplePolicy}, want: "--ca-secret: required"},
		"policy required":     {args: []string{"--ca-secret=ns/ca"}, want: "--policy: required"},
		"policy missing":      {args: []string{"--ca-secret=ns/ca", "--policy=/nonexistent/policy.yaml"}, want: "--policy: open /nonexistent/policy.yaml"},
		"policy misspelt":     {args: []string{"--ca-secret=ns/ca", "--policy=" + bad}, want: "serviceName"},
		"reserved signer":     {args: append(ok, "--signer-name=kubernetes.io/kube-apiserver-client-pod"), want: "--signer-name"},
		"signer without path": {args: append(ok, "--signer-name=evercert.io"), want: "--signer-name"},
		"no workers":          {args: append(ok, "--workers=0"), want: "--workers"},
		"no key types":        {args: append(ok, "--key-types="), want: "--key-types"},
		"unknown key type":    {args: append(ok, "--key-types=ECDSAP256,RSA1024"), want: `--key-types: unknown key type "RSA1024"`},
		"lifetime too short":  {args: append(ok, "--max-lifetime=30m"), want: "--max-lifetime"},
		"lifetime too long":   {args: append(ok, "--max-lifetime=2400h"), want: "--max-lifetime"},
		"no qps":              {args: append(ok, "--kube-api-qps=0"), want: "--kube-api-qps"},
		"server flags too":    {args: append(ok, "--secure-port=70000"), want: "--secure-port"},
	} {
		t.Run(name, func(t *testing.T) {
			assert.ErrorContains(t, errors.Join(parse(t, tc.args...).Validate()...), tc.want)
		})
	}
}
