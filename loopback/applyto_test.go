package loopback_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/rest"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/loopback"
)

type fakeListener struct {
	net.Listener
	addr net.Addr
}

func (f fakeListener) Addr() net.Addr { return f.addr }

func newInfo(t *testing.T) *server.SecureServingInfo {
	t.Helper()
	return &server.SecureServingInfo{
		Listener: fakeListener{addr: &net.TCPAddr{IP: net.IPv4zero, Port: 6443}},
	}
}

func TestApplyToNoop(t *testing.T) {
	var cfg *rest.Config
	c, err := loopback.ApplyTo(nil, &cfg, loopback.CertificateConfig{})
	assert.NoError(t, err)
	assert.Nil(t, c)

	var info *server.SecureServingInfo
	c, err = loopback.ApplyTo(&info, &cfg, loopback.CertificateConfig{})
	assert.NoError(t, err)
	assert.Nil(t, c)
	assert.Nil(t, cfg)

	info = newInfo(t)
	c, err = loopback.ApplyTo(&info, nil, loopback.CertificateConfig{})
	assert.NoError(t, err)
	assert.Nil(t, c)
	assert.Empty(t, info.SNICerts)
}

func TestApplyTo(t *testing.T) {
	sniFirst, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: "other", Hosts: []string{"other.example"}})
	require.NoError(t, err)
	info := newInfo(t)
	info.SNICerts = []dynamiccertificates.SNICertKeyContentProvider{sniFirst}
	existing := &rest.Config{Host: "https://insecure.example"}
	cfg := existing

	c, err := loopback.ApplyTo(&info, &cfg, loopback.CertificateConfig{})
	require.NoError(t, err)
	require.NotNil(t, c)
	require.Len(t, info.SNICerts, 2)
	assert.Same(t, c, info.SNICerts[0], "the loopback certificate comes first")
	assert.Same(t, sniFirst, info.SNICerts[1])
	assert.NotSame(t, existing, cfg, "an existing config is replaced on success")
	assert.Equal(t, "https://127.0.0.1:6443", cfg.Host)
	assert.NotEmpty(t, cfg.BearerToken)
	assert.Equal(t, loopback.ServerName, cfg.ServerName)
}

func TestApplyToFallback(t *testing.T) {
	t.Run("no fallback config: error, certificate removed", func(t *testing.T) {
		info := &server.SecureServingInfo{} // no listener
		var cfg *rest.Config
		c, err := loopback.ApplyTo(&info, &cfg, loopback.CertificateConfig{})
		assert.Error(t, err)
		assert.Nil(t, c)
		assert.Nil(t, cfg)
		assert.Empty(t, info.SNICerts)
	})
	t.Run("fallback config kept, certificate served", func(t *testing.T) {
		info := &server.SecureServingInfo{}
		existing := &rest.Config{Host: "http://127.0.0.1:8080"}
		cfg := existing
		c, err := loopback.ApplyTo(&info, &cfg, loopback.CertificateConfig{})
		assert.NoError(t, err)
		require.NotNil(t, c)
		assert.Same(t, existing, cfg)
		require.Len(t, info.SNICerts, 1)
		assert.Same(t, c, info.SNICerts[0])
	})
	t.Run("invalid options", func(t *testing.T) {
		info := newInfo(t)
		var cfg *rest.Config
		_, err := loopback.ApplyTo(&info, &cfg, loopback.CertificateConfig{Validity: -1})
		assert.Error(t, err)
		assert.Empty(t, info.SNICerts)
		assert.Nil(t, cfg)
	})
}

func TestApplyToConfig(t *testing.T) {
	cfg := server.NewConfig(serializer.NewCodecFactory(runtime.NewScheme()))
	cfg.SecureServing = newInfo(t)
	healthz, livez, readyz := len(cfg.HealthzChecks), len(cfg.LivezChecks), len(cfg.ReadyzChecks)

	c, err := loopback.ApplyToConfig(cfg, loopback.CertificateConfig{})
	require.NoError(t, err)
	require.NotNil(t, c)
	require.NotNil(t, cfg.LoopbackClientConfig)
	assert.Same(t, c, cfg.SecureServing.SNICerts[0])
	require.Len(t, cfg.HealthzChecks, healthz+1)
	require.Len(t, cfg.LivezChecks, livez+1)
	assert.Len(t, cfg.ReadyzChecks, readyz, "like upstream, not a readiness check")
	assert.Equal(t, loopback.HealthCheckName, cfg.HealthzChecks[healthz].Name())
	assert.Equal(t, loopback.HealthCheckName, cfg.LivezChecks[livez].Name())
	assert.Contains(t, cfg.PostStartHooks, loopback.PostStartHookName)

	// Secure serving off: nothing happens.
	off := server.NewConfig(serializer.NewCodecFactory(runtime.NewScheme()))
	c, err = loopback.ApplyToConfig(off, loopback.CertificateConfig{})
	assert.NoError(t, err)
	assert.Nil(t, c)
	assert.Nil(t, off.LoopbackClientConfig)
	assert.NotContains(t, off.PostStartHooks, loopback.PostStartHookName)
}

// TestApplyToRefusesEarlierLoopback: a loopback already in the serving
// configuration (upstream's, or evercert's applied twice) is a clear error
// and nothing changes, instead of a second loopback whose client config
// would not trust the certificate the server serves.
func TestApplyToRefusesEarlierLoopback(t *testing.T) {
	upstream := func(t *testing.T) (*server.SecureServingInfo, *rest.Config) {
		var info *server.SecureServingInfo
		var cfg *rest.Config
		ss := &options.SecureServingOptions{Listener: newInfo(t).Listener}
		require.NoError(t, ss.WithLoopback().ApplyTo(&info, &cfg))
		return info, cfg
	}
	evercert := func(t *testing.T) (*server.SecureServingInfo, *rest.Config) {
		info := newInfo(t)
		var cfg *rest.Config
		_, err := loopback.ApplyTo(&info, &cfg, loopback.CertificateConfig{})
		require.NoError(t, err)
		return info, cfg
	}
	for name, earlier := range map[string]func(*testing.T) (*server.SecureServingInfo, *rest.Config){
		"upstream SecureServingOptionsWithLoopback": upstream,
		"evercert twice": evercert,
	} {
		t.Run(name, func(t *testing.T) {
			info, cfg := earlier(t)
			sni, before := info.SNICerts, cfg
			c, err := loopback.ApplyTo(&info, &cfg, loopback.CertificateConfig{})
			require.ErrorIs(t, err, loopback.ErrWrongOrder)
			assert.ErrorContains(t, err, loopback.ServerName)
			assert.ErrorContains(t, err, "loopback.ApplyRecommendedOptions instead of RecommendedOptions.ApplyTo")
			assert.Nil(t, c)
			assert.Equal(t, sni, info.SNICerts, "SNI certificates unchanged")
			assert.Same(t, before, cfg, "loopback client config unchanged")
		})
	}
}

// TestApplyToConfigRefusesUpstream is the old wiring: loopback.ApplyToConfig
// after upstream's loopback (what RecommendedOptions.ApplyTo does). It fails
// at once with ErrWrongOrder, and the config keeps exactly one loopback.
func TestApplyToConfigRefusesUpstream(t *testing.T) {
	cfg := server.NewConfig(serializer.NewCodecFactory(runtime.NewScheme()))
	ss := &options.SecureServingOptions{Listener: newInfo(t).Listener}
	require.NoError(t, ss.WithLoopback().ApplyToConfig(cfg))
	healthz, livez, sni, client := len(cfg.HealthzChecks), len(cfg.LivezChecks), len(cfg.SecureServing.SNICerts), cfg.LoopbackClientConfig

	c, err := loopback.ApplyToConfig(cfg, loopback.CertificateConfig{})
	require.ErrorIs(t, err, loopback.ErrWrongOrder)
	assert.ErrorContains(t, err, `"loopback-serving-certificate" health check`)
	assert.Nil(t, c)
	assert.Len(t, cfg.HealthzChecks, healthz)
	assert.Len(t, cfg.LivezChecks, livez)
	assert.Len(t, cfg.SecureServing.SNICerts, sni)
	assert.Same(t, client, cfg.LoopbackClientConfig)
	assert.NotContains(t, cfg.PostStartHooks, loopback.PostStartHookName)

	// Applying evercert's twice is refused the same way.
	cfg = server.NewConfig(serializer.NewCodecFactory(runtime.NewScheme()))
	cfg.SecureServing = newInfo(t)
	_, err = loopback.ApplyToConfig(cfg, loopback.CertificateConfig{})
	require.NoError(t, err)
	_, err = loopback.ApplyToConfig(cfg, loopback.CertificateConfig{})
	require.ErrorIs(t, err, loopback.ErrWrongOrder)
	assert.Len(t, cfg.SecureServing.SNICerts, 1)
}
