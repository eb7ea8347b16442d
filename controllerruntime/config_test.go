package controllerruntime

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
)

// offlineManager is a manager for an API server that does not exist:
// NewManager and Add make no request, so configuration errors show without
// a cluster.
func offlineManager(t *testing.T) manager.Manager {
	t.Helper()
	mgr, err := ctrl.NewManager(&rest.Config{Host: "https://127.0.0.1:1"}, ctrl.Options{
		Metrics:       metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: freePort(t)}),
	})
	require.NoError(t, err)
	return mgr
}

// TestAddRefusesBadConfig shows that each bad input is refused by Add with
// an error naming the field, before anything is added to the manager.
func TestAddRefusesBadConfig(t *testing.T) {
	selfSigned, err := authority.NewSelfSigned(authority.SelfSignedConfig{Hosts: []string{"webhook.test"}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		cfg  Config
		nilM bool
		want string
	}{
		{name: "nil manager", nilM: true, cfg: Config{Namespace: "ns", SecretName: "ca", ServiceName: "svc"}, want: "the manager is nil"},
		{name: "no namespace", cfg: Config{SecretName: "ca", Hosts: []string{"h"}}, want: "Config.Namespace is required"},
		{name: "no secret name", cfg: Config{Namespace: "ns", ServiceName: "svc"}, want: "Config.SecretName is required"},
		{name: "no hosts", cfg: Config{Namespace: "ns", SecretName: "ca"}, want: "Config.Hosts is empty and Config.ServiceName is not set"},
		{name: "source without bundle", cfg: Config{Source: selfSigned, CRDs: []string{"widgets.example.com"}}, want: "Config.CABundle is required with Config.Source"},
		{name: "bad target name", cfg: Config{Namespace: "ns", SecretName: "ca", ServiceName: "svc", ValidatingWebhooks: []string{"Not_A_Name"}},
			want: `PublisherConfig.Targets[0].Name "Not_A_Name" is invalid`},
		{name: "bad authority", cfg: Config{Namespace: "ns", SecretName: "ca", ServiceName: "svc", Authority: authority.Config{Lifetime: time.Millisecond}},
			want: "Config.Authority: authority ns/ca: lifetime 1ms must be at least"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mgr manager.Manager
			if !tc.nilM {
				mgr = offlineManager(t)
			}
			certs, err := Add(mgr, tc.cfg)
			require.Error(t, err)
			assert.Nil(t, certs)
			assert.Contains(t, err.Error(), tc.want)
			if mgr != nil {
				// Nothing was registered: the check name is still free.
				assert.NoError(t, mgr.AddReadyzCheck(CheckName, healthz.Ping))
				assert.Empty(t, mgr.GetWebhookServer().(*webhook.DefaultServer).Options.TLSOpts)
			}
		})
	}
}

// TestAddSourceWithoutTargets shows the inputs that are fine: a Source
// needs no CABundle when nothing is published, and ServiceName derives the
// hosts.
func TestAddSourceWithoutTargets(t *testing.T) {
	selfSigned, err := authority.NewSelfSigned(authority.SelfSignedConfig{Hosts: []string{"webhook.test"}})
	require.NoError(t, err)
	mgr := offlineManager(t)
	certs, err := Add(mgr, Config{Source: selfSigned})
	require.NoError(t, err)
	assert.Len(t, mgr.GetWebhookServer().(*webhook.DefaultServer).Options.TLSOpts, 1, "TLSOpts appended to the webhook server")
	assert.NotNil(t, certs.TLSOpts())

	cfg := Config{Namespace: "ns", ServiceName: "svc"}
	assert.Equal(t, []string{"svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local"}, cfg.hosts())
	assert.Equal(t, []cabundle.Target{{Kind: cabundle.CustomResourceDefinition, Name: "a.b"}}, (&Config{CRDs: []string{"a.b"}}).targets())
}

// startedManager returns a manager that has started and keeps running
// (its webhook server has a certificate of its own) until the test ends,
// its webhook server, and the channel mgr.Start's error arrives on.
func startedManager(t *testing.T) (manager.Manager, *webhook.DefaultServer, <-chan error) {
	t.Helper()
	// The webhook server has a certificate of its own, so it starts and the
	// manager keeps running.
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{Hosts: []string{"127.0.0.1"}})
	require.NoError(t, err)
	require.NoError(t, serving.RunOnce(context.Background()))
	own := func(c *tls.Config) {
		c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			_, _, cert := serving.CurrentParsedCertKeyContent()
			return cert, nil
		}
	}
	mgr, err := ctrl.NewManager(&rest.Config{Host: "https://127.0.0.1:1"}, ctrl.Options{
		Metrics:       metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: freePort(t), TLSOpts: []func(*tls.Config){own}}),
	})
	require.NoError(t, err)
	ws := mgr.GetWebhookServer().(*webhook.DefaultServer)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	// The manager has started once it refuses new checks.
	require.Eventually(t, func() bool { return mgr.AddHealthzCheck("probe", healthz.Ping) != nil }, time.Minute, 10*time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the manager stopped: %v", err)
	default:
	}
	return mgr, ws, done
}

// TestAddAfterStartIsRefused shows that Add on a started manager returns an
// error saying so and leaves the webhook server's TLSOpts alone (the server
// may be reading them).
func TestAddAfterStartIsRefused(t *testing.T) {
	mgr, ws, done := startedManager(t)
	certs, err := Add(mgr, Config{Namespace: "ns", SecretName: "ca", ServiceName: "svc", ValidatingWebhooks: []string{"x"}})
	require.Error(t, err)
	assert.Nil(t, certs)
	assert.Contains(t, err.Error(), "call Add before the manager starts")
	assert.Len(t, ws.Options.TLSOpts, 1, "only the server's own option")
	select {
	case err := <-done:
		t.Fatalf("the manager stopped: %v", err)
	default:
	}
}

// TestAddReplicaIDFromPodName: the Authority Add makes announces itself
// under $POD_NAME unless Config.Authority.ReplicaID says otherwise, so a
// process restarted in its pod keeps its replica's Lease (issue 27).
func TestAddReplicaIDFromPodName(t *testing.T) {
	t.Setenv("POD_NAME", "operator-6c9f-7xq2k")
	certs, err := Add(offlineManager(t), Config{Namespace: "ns", SecretName: "ca", ServiceName: "svc"})
	require.NoError(t, err)
	assert.Equal(t, "operator-6c9f-7xq2k", certs.rotation.(*authority.Authority).ReplicaID())

	certs, err = Add(offlineManager(t), Config{Namespace: "ns", SecretName: "ca", ServiceName: "svc", Authority: authority.Config{ReplicaID: "operator-0"}})
	require.NoError(t, err)
	assert.Equal(t, "operator-0", certs.rotation.(*authority.Authority).ReplicaID())
}
