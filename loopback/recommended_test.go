package loopback_test

import (
	"context"
	"crypto/tls"
	"math/big"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/compatibility"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/loopback"
)

// recommendedOptions returns upstream's RecommendedOptions for a server on
// 127.0.0.1 (a listener on a free port) that needs neither etcd nor a
// kube-apiserver: no Etcd, CoreAPI or Admission, priority and fairness off,
// delegated authentication and authorization optional, so only the loopback
// token (system:masters) and the always-allowed health paths get in.
func recommendedOptions(t testing.TB) *options.RecommendedOptions {
	t.Helper()
	o := options.NewRecommendedOptions("/registry/loopback-test", nil)
	o.Etcd, o.CoreAPI, o.Admission = nil, nil, nil
	o.Features.EnablePriorityAndFairness = false
	o.Authentication.RemoteKubeConfigFileOptional = true
	o.Authorization.RemoteKubeConfigFileOptional = true
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	o.SecureServing.Listener = ln
	return o
}

func newRecommendedConfig() *server.RecommendedConfig {
	cfg := server.NewRecommendedConfig(newCodecs())
	cfg.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	return cfg
}

// loopbackChecks returns the checks named loopback.HealthCheckName.
func loopbackChecks(checks []healthz.HealthChecker) []healthz.HealthChecker {
	var out []healthz.HealthChecker
	for _, c := range checks {
		if c.Name() == loopback.HealthCheckName {
			out = append(out, c)
		}
	}
	return out
}

// servedSerial handshakes with addr for serverName, verifying against
// bundle at now, and returns the served leaf's serial.
func servedSerial(t *testing.T, addr, serverName string, bundle []byte, now func() time.Time) *big.Int {
	t.Helper()
	leaf, err := tlstest.Dial(addr, &tls.Config{ServerName: serverName, RootCAs: tlstest.Pool(t, bundle), Time: now})
	require.NoError(t, err, "handshake for %q", serverName)
	return leaf.SerialNumber
}

// TestApplyRecommendedOptions runs a genericapiserver configured by
// ApplyRecommendedOptions from upstream's RecommendedOptions, with the
// default serving certificate, on a fake clock. The loopback client config
// that ExtraAdmissionInitializers sees (where sample-apiserver builds its
// admission informers) is evercert's, there is exactly one loopback
// certificate and one "loopback-serving-certificate" check, and a clientset
// built in ExtraAdmissionInitializers, before the server ran, keeps working
// while the server's own loops rotate the loopback certificate (leaf and CA)
// and the self-signed serving certificate.
func TestApplyRecommendedOptions(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now())
	o := recommendedOptions(t)
	var initializerConfig *rest.Config
	var early kubernetes.Interface
	o.ExtraAdmissionInitializers = func(c *server.RecommendedConfig) ([]admission.PluginInitializer, error) {
		initializerConfig = c.LoopbackClientConfig
		var err error
		early, err = kubernetes.NewForConfig(c.LoopbackClientConfig)
		return nil, err
	}
	cfg := newRecommendedConfig()
	applied, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{Loopback: loopback.CertificateConfig{Clock: fc}})
	require.NoError(t, err)
	require.NotNil(t, applied.Loopback)
	require.NotNil(t, initializerConfig)
	assert.Same(t, cfg.LoopbackClientConfig, initializerConfig, "ExtraAdmissionInitializers got evercert's loopback client config")
	assert.NotNil(t, o.SecureServing, "the caller's options keep their SecureServing")

	serving, ok := applied.Serving.(*authority.SelfSigned)
	require.True(t, ok, "the default serving certificate is self-signed in memory, got %T", applied.Serving)
	assert.Equal(t, loopback.DefaultServingName, serving.Name())
	assert.Same(t, serving, cfg.SecureServing.Cert)
	require.Len(t, cfg.SecureServing.SNICerts, 1, "evercert's loopback is the only SNI certificate")
	assert.Same(t, applied.Loopback, cfg.SecureServing.SNICerts[0])
	for name, checks := range map[string][]healthz.HealthChecker{"healthz": cfg.HealthzChecks, "livez": cfg.LivezChecks} {
		got := loopbackChecks(checks)
		require.Len(t, got, 1, "one %s loopback check", name)
		assert.Equal(t, applied.Loopback.HealthCheck(), got[0], "the %s loopback check is evercert's", name)
	}
	assert.Empty(t, loopbackChecks(cfg.ReadyzChecks), "like upstream's, the loopback check is no readiness check")

	s, err := cfg.Complete().New("recommended-test", server.NewEmptyDelegate())
	require.NoError(t, err)
	runServer(t, s)
	addr := s.SecureServingInfo.Listener.Addr().String()
	ctx := context.Background()

	for path, want := range map[string][]string{
		"/healthz": {"[+]" + loopback.HealthCheckName + " ok", "[+]ca-rotation:serving ok"},
		"/livez":   {"[+]" + loopback.HealthCheckName + " ok"},
		"/readyz":  {"[+]ca-rotation:serving ok"},
	} {
		body, err := early.Discovery().RESTClient().Get().AbsPath(path).Param("verbose", "true").DoRaw(ctx)
		require.NoError(t, err, path)
		for _, line := range want {
			assert.Equal(t, 1, strings.Count(string(body), line), "%s lists %q once:\n%s", path, line, body)
		}
		if path == "/readyz" {
			assert.NotContains(t, string(body), loopback.HealthCheckName)
		}
	}

	// Step the fake clock to the next renewal, let the server's own loops
	// rotate, and use the clientset made before the server ran.
	loopbackCAs, servingLeaves := map[string]bool{}, map[string]bool{serving.Leaf().SerialNumber.Text(16): true}
	for step := 0; len(servingLeaves) < 3; step++ {
		require.Less(t, step, 200, "the serving certificate rotated twice within 200 steps")
		fc.SetTime(minTime(applied.Loopback.RenewAt(), serving.RenewAt()).Add(time.Millisecond))
		require.Eventually(t, func() bool {
			return applied.Loopback.RenewAt().After(fc.Now()) && serving.RenewAt().After(fc.Now())
		}, 30*time.Second, time.Millisecond, "step %d: the rotation loops renewed what was due", step)
		require.Eventually(t, func() bool {
			return servedSerial(t, addr, loopback.ServerName, applied.Loopback.CurrentCABundleContent(), fc.Now).Cmp(applied.Loopback.Leaf().SerialNumber) == 0 &&
				servedSerial(t, addr, "localhost", serving.CurrentCABundleContent(), fc.Now).Cmp(serving.Leaf().SerialNumber) == 0
		}, 30*time.Second, 5*time.Millisecond, "step %d: the server serves the current leaves", step)
		_, err := early.Discovery().ServerVersion()
		require.NoError(t, err, "step %d: the clientset built before start still works", step)
		loopbackCAs[string(applied.Loopback.Leaf().AuthorityKeyId)] = true
		servingLeaves[serving.Leaf().SerialNumber.Text(16)] = true
	}
	assert.GreaterOrEqual(t, len(loopbackCAs), 5, "the loopback CA rotated too")
	t.Logf("fake clock advanced %v: %d loopback CAs, %d serving leaves", fc.Since(time.Now()).Round(time.Hour), len(loopbackCAs), len(servingLeaves))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// TestApplyRecommendedOptionsWrongOrder: every order that would leave two
// loopbacks is refused with ErrWrongOrder and a message naming the fix, and
// the refused call changes nothing.
func TestApplyRecommendedOptionsWrongOrder(t *testing.T) {
	t.Run("after RecommendedOptions.ApplyTo", func(t *testing.T) {
		o, cfg := recommendedOptions(t), newRecommendedConfig()
		require.NoError(t, o.ApplyTo(cfg))
		client, sni := cfg.LoopbackClientConfig, cfg.SecureServing.SNICerts
		_, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{})
		require.ErrorIs(t, err, loopback.ErrWrongOrder)
		assert.ErrorContains(t, err, "call loopback.ApplyRecommendedOptions instead of RecommendedOptions.ApplyTo")
		assert.Same(t, client, cfg.LoopbackClientConfig)
		assert.Equal(t, sni, cfg.SecureServing.SNICerts)
	})
	t.Run("old wiring: loopback.ApplyToConfig after RecommendedOptions.ApplyTo", func(t *testing.T) {
		o, cfg := recommendedOptions(t), newRecommendedConfig()
		require.NoError(t, o.ApplyTo(cfg))
		_, err := loopback.ApplyToConfig(&cfg.Config, loopback.CertificateConfig{})
		require.ErrorIs(t, err, loopback.ErrWrongOrder)
		assert.ErrorContains(t, err, "loopback.ApplyRecommendedOptions instead of RecommendedOptions.ApplyTo")
		assert.Len(t, loopbackChecks(cfg.HealthzChecks), 1, "upstream's check only")
		assert.Len(t, cfg.SecureServing.SNICerts, 1, "upstream's loopback certificate only")
	})
	t.Run("twice", func(t *testing.T) {
		o, cfg := recommendedOptions(t), newRecommendedConfig()
		_, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{})
		require.NoError(t, err)
		_, err = loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{})
		require.ErrorIs(t, err, loopback.ErrWrongOrder)
		assert.Len(t, loopbackChecks(cfg.HealthzChecks), 1)
	})
}

// TestApplyRecommendedOptionsServing: a serving certificate provider of the
// caller's choice becomes the default serving certificate; combined with
// certificate files or GeneratedCert, or with secure serving off, it is an
// error that names the conflict, and no listener is opened.
func TestApplyRecommendedOptionsServing(t *testing.T) {
	provider, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: "mine"})
	require.NoError(t, err)

	o, cfg := recommendedOptions(t), newRecommendedConfig()
	applied, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{Serving: provider})
	require.NoError(t, err)
	assert.Same(t, provider, applied.Serving)
	assert.Same(t, provider, cfg.SecureServing.Cert)
	assert.Len(t, cfg.ReadyzChecks, len(newRecommendedConfig().ReadyzChecks)+1, "its CA rotation check")

	for name, set := range map[string]func(*options.SecureServingOptions){
		"--tls-cert-file":        func(ss *options.SecureServingOptions) { ss.ServerCert.CertKey.CertFile = "/tls.crt" },
		"--tls-private-key-file": func(ss *options.SecureServingOptions) { ss.ServerCert.CertKey.KeyFile = "/tls.key" },
		"ServerCert.GeneratedCert": func(ss *options.SecureServingOptions) {
			require.NoError(t, ss.MaybeDefaultWithSelfSignedCerts("localhost", nil, nil))
			ss.ServerCert.CertKey = options.CertKey{} // in memory, not in a cert dir
		},
	} {
		t.Run(name, func(t *testing.T) {
			o, cfg := recommendedOptions(t), newRecommendedConfig()
			o.SecureServing.Listener, o.SecureServing.BindPort = nil, 1 // would bind if applied
			o.SecureServing.ServerCert.CertDirectory = ""
			set(o.SecureServing.SecureServingOptions)
			_, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{Serving: provider})
			require.Error(t, err)
			assert.ErrorContains(t, err, name)
			assert.Nil(t, o.SecureServing.Listener, "nothing was bound")
			assert.Nil(t, cfg.SecureServing)
		})
	}

	t.Run("secure serving off", func(t *testing.T) {
		o, cfg := recommendedOptions(t), newRecommendedConfig()
		o.SecureServing.Listener, o.SecureServing.BindPort = nil, 0
		_, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{Serving: provider})
		assert.ErrorContains(t, err, "secure serving is off")

		o, cfg = recommendedOptions(t), newRecommendedConfig()
		o.SecureServing.Listener, o.SecureServing.BindPort = nil, 0
		applied, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{})
		require.NoError(t, err, "as upstream, no secure serving means no loopback")
		assert.Nil(t, applied.Loopback)
		assert.Nil(t, applied.Serving)
		assert.Nil(t, cfg.LoopbackClientConfig)
	})
}

// envUpstreamAfterwards switches TestApplyRecommendedOptionsUpstreamAfterwards
// into its child role.
const envUpstreamAfterwards = "EVERCERT_TEST_UPSTREAM_AFTERWARDS"

// TestApplyRecommendedOptionsUpstreamAfterwards applies upstream's loopback
// (SecureServingOptionsWithLoopback.ApplyToConfig, part of
// RecommendedOptions.ApplyTo) after ApplyRecommendedOptions, which replaces
// the loopback client config and the serving info. The server, run in a
// child process, must exit at start with ErrWrongOrder from the rotation
// post-start hook instead of serving upstream's loopback.
func TestApplyRecommendedOptionsUpstreamAfterwards(t *testing.T) {
	if os.Getenv(envUpstreamAfterwards) == "1" {
		o, cfg := recommendedOptions(t), newRecommendedConfig()
		_, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{})
		require.NoError(t, err)
		require.NoError(t, o.SecureServing.ApplyToConfig(&cfg.Config)) // the wrong order
		s, err := cfg.Complete().New("upstream-afterwards", server.NewEmptyDelegate())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), proctest.ExitGuard/2)
		defer cancel()
		_ = s.PrepareRun().RunWithContext(ctx)
		t.Fatal("the server ran until the timeout")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestApplyRecommendedOptionsUpstreamAfterwards$", "-test.count=1")
	cmd.Env = append(os.Environ(), envUpstreamAfterwards+"=1")
	code, out := proctest.RunToExit(t, cmd)
	assert.NotZero(t, code, "the server exits")
	assert.Contains(t, out, `PostStartHook "`+loopback.PostStartHookName+`" failed`)
	assert.Contains(t, out, loopback.ErrWrongOrder.Error())
	assert.Contains(t, out, "loopback.ApplyRecommendedOptions replaces RecommendedOptions.ApplyTo")
	assert.NotContains(t, out, "the server ran until the timeout")
}

// TestApplyRecommendedOptionsAlternateNames: the alternate names
// sample-apiserver passes to MaybeDefaultWithSelfSignedCerts (the Service
// name the aggregator verifies) go into the self-signed default through
// ApplyConfig.AlternateDNS and AlternateIPs: a real handshake for each of
// them verifies against the applied serving CA bundle. Names given where
// they cannot apply (a provider, GeneratedCert) are refused, not dropped.
func TestApplyRecommendedOptionsAlternateNames(t *testing.T) {
	const svcName = "wardle-server.wardle.svc"
	o, cfg := recommendedOptions(t), newRecommendedConfig()
	applied, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{
		AlternateDNS: []string{svcName}, AlternateIPs: []net.IP{net.ParseIP("10.96.0.7")},
	})
	require.NoError(t, err)
	serving, ok := applied.Serving.(dynamiccertificates.CAContentProvider)
	require.True(t, ok, "the self-signed default has a CA bundle, got %T", applied.Serving)
	s, err := cfg.Complete().New("alternate-names-test", server.NewEmptyDelegate())
	require.NoError(t, err)
	runServer(t, s)
	addr := s.SecureServingInfo.Listener.Addr().String()
	for _, name := range []string{svcName, "10.96.0.7", "localhost"} {
		_, err := tlstest.Dial(addr, &tls.Config{ServerName: name, RootCAs: tlstest.Pool(t, serving.CurrentCABundleContent())})
		assert.NoError(t, err, "handshake for %q verifies against the applied serving CA", name)
	}

	provider, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: "mine"})
	require.NoError(t, err)
	_, err = loopback.ApplyRecommendedOptions(recommendedOptions(t), newRecommendedConfig(), loopback.ApplyConfig{Serving: provider, AlternateDNS: []string{svcName}})
	assert.ErrorContains(t, err, "AlternateDNS [wardle-server.wardle.svc]")
	o = recommendedOptions(t)
	o.SecureServing.ServerCert.CertKey.CertFile, o.SecureServing.ServerCert.CertKey.KeyFile = "/tls.crt", "/tls.key"
	_, err = loopback.ApplyRecommendedOptions(o, newRecommendedConfig(), loopback.ApplyConfig{AlternateDNS: []string{svcName}})
	assert.ErrorContains(t, err, "--tls-cert-file /tls.crt")
	assert.ErrorContains(t, err, "AlternateDNS [wardle-server.wardle.svc]")
}

// TestApplyRecommendedOptionsThenRecommendedApplyTo: the likeliest mistake,
// loopback.ApplyRecommendedOptions added and o.ApplyTo(cfg) left in place
// after it, returns ErrWrongOrder with evercert's message naming the fix,
// with and without admission (which upstream would otherwise fail on with
// "unable to add start-apiserver-admission-initializer ... already
// registered"). The same options still apply to a new config.
func TestApplyRecommendedOptionsThenRecommendedApplyTo(t *testing.T) {
	for name, withAdmission := range map[string]bool{"without admission": false, "with admission": true} {
		t.Run(name, func(t *testing.T) {
			o, cfg := recommendedOptions(t), newRecommendedConfig()
			if withAdmission {
				// Admission with no plugin, on a client that is never
				// called: enough for upstream to register its admission
				// post-start hook.
				o.Admission = options.NewAdmissionOptions()
				o.Admission.RecommendedPluginOrder, o.Admission.DefaultOffPlugins = nil, nil
				cfg.ClientConfig = &rest.Config{Host: "https://127.0.0.1:1"}
				cfg.SharedInformerFactory = informers.NewSharedInformerFactory(kubefake.NewClientset(), 0)
			}
			calls := 0
			o.ExtraAdmissionInitializers = func(*server.RecommendedConfig) ([]admission.PluginInitializer, error) {
				calls++
				return nil, nil
			}
			_, err := loopback.ApplyRecommendedOptions(o, cfg, loopback.ApplyConfig{})
			require.NoError(t, err)
			require.Equal(t, 1, calls)

			err = o.ApplyTo(cfg) // the wrong order
			require.ErrorIs(t, err, loopback.ErrWrongOrder)
			assert.ErrorContains(t, err, "remove the RecommendedOptions.ApplyTo call")
			assert.NotContains(t, err.Error(), "already registered")
			assert.Equal(t, 1, calls, "the caller's initializers did not run again")

			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close() })
			o.SecureServing.Listener = ln
			cfg2 := newRecommendedConfig()
			cfg2.ClientConfig, cfg2.SharedInformerFactory = cfg.ClientConfig, cfg.SharedInformerFactory
			_, err = loopback.ApplyRecommendedOptions(o, cfg2, loopback.ApplyConfig{})
			require.NoError(t, err, "the options apply to a new config")
			assert.Equal(t, 2, calls, "and the caller's initializers ran for it")
		})
	}
}
