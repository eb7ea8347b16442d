package loopback_test

import (
	"crypto/ecdsa"
	"crypto/x509"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/loopback"
)

func TestNewCertificate(t *testing.T) {
	now := time.Date(2031, 5, 1, 0, 0, 0, 0, time.UTC)
	c, err := loopback.NewCertificate(loopback.CertificateConfig{Clock: clocktesting.NewFakeClock(now)})
	require.NoError(t, err)

	leaf := c.Leaf()
	assert.Equal(t, loopback.ServerName, leaf.Subject.CommonName)
	assert.Equal(t, []string{"apiserver-loopback-client"}, leaf.DNSNames, "the server name is the only DNS name")
	assert.Empty(t, leaf.IPAddresses)
	assert.Equal(t, []string{"apiserver-loopback-client"}, c.SNINames(), "served for that SNI name only")
	assert.Equal(t, loopback.ProviderName, c.Name())
	assert.IsType(t, &ecdsa.PublicKey{}, leaf.PublicKey)
	assert.Equal(t, now.Add(24*time.Hour), leaf.NotAfter)
	assert.Equal(t, now.Add(16*time.Hour), c.RenewAt())
	assert.NoError(t, c.LastError())

	_, err = leaf.Verify(x509.VerifyOptions{
		Roots: tlstest.Pool(t, c.CurrentCABundleContent()), DNSName: loopback.ServerName, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	require.NoError(t, err)
}

func TestHostPort(t *testing.T) {
	for _, tc := range []struct{ in, host, port string }{
		{"0.0.0.0:6443", "127.0.0.1", "6443"},
		{"[::]:6443", "::1", "6443"},
		{"127.0.0.1:8444", "127.0.0.1", "8444"},
		{"[::1]:1", "::1", "1"},
		{"10.1.2.3:443", "10.1.2.3", "443"},
		{"localhost:443", "localhost", "443"},
		{"example.test:0", "example.test", "0"},
	} {
		host, port, err := loopback.HostPort(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.host, host, tc.in)
		assert.Equal(t, tc.port, port, tc.in)
	}
	for _, bad := range []string{"", "127.0.0.1", "::1"} {
		_, _, err := loopback.HostPort(bad)
		assert.Error(t, err, bad)
	}
}

func TestRestConfig(t *testing.T) {
	c, err := loopback.NewCertificate(loopback.CertificateConfig{})
	require.NoError(t, err)

	cfg, err := c.RestConfig("0.0.0.0:6443", "")
	require.NoError(t, err)
	assert.Equal(t, "https://127.0.0.1:6443", cfg.Host)
	assert.Equal(t, float32(-1), cfg.QPS, "loopback QPS is not limited")
	assert.Equal(t, loopback.ServerName, cfg.TLSClientConfig.ServerName)
	assert.Equal(t, c.CurrentCABundleContent(), cfg.TLSClientConfig.CAData)
	assert.False(t, cfg.TLSClientConfig.Insecure)
	assert.Nil(t, cfg.Transport)
	assert.NotNil(t, cfg.WrapTransport)
	id, err := uuid.Parse(cfg.BearerToken)
	require.NoError(t, err, "token is a UUID")
	assert.Equal(t, uuid.Version(4), id.Version())

	cfg2, err := c.RestConfig("[::]:6443", "")
	require.NoError(t, err)
	assert.Equal(t, "https://[::1]:6443", cfg2.Host)
	assert.NotEqual(t, cfg.BearerToken, cfg2.BearerToken, "every config gets a new token")

	cfg3, err := c.RestConfig("127.0.0.1:1", "given")
	require.NoError(t, err)
	assert.Equal(t, "given", cfg3.BearerToken)

	_, err = c.RestConfig("no-port", "")
	assert.Error(t, err)
}
