package migrate

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/evercert/evercert/authority"
)

// TestMigrateFromCertController: OPA cert-controller's rotator runs for
// real in a controller-runtime manager, writes its Secret and injects its
// CA into the webhook configuration; the webhook serves the leaf from the
// Secret's files through controller-runtime's certwatcher, as a
// cert-controller webhook pod does (the test copies the Secret to the
// files, standing in for the kubelet's volume). Then the manager stops and
// two evercert replicas adopt the Secret (LayoutCertController) while the
// kube-apiserver calls the webhook: 0 failed calls across the switch and
// the first observed CA rotation after it.
func TestMigrateFromCertController(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	mgr, err := manager.New(e.cluster.Config(), manager.Options{
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	require.NoError(t, err)
	ready := make(chan struct{})
	certDir := t.TempDir()
	require.NoError(t, rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey: types.NamespacedName{Namespace: ns, Name: secretName},
		CertDir:   certDir, CAName: "migrate-ca", CAOrganization: "evercert", DNSName: dnsName,
		IsReady:  ready,
		Webhooks: []rotator.WebhookInfo{{Name: vwcName, Type: rotator.Validating}},
		// Short, so that evercert's first rotation follows the switch
		// within a minute; no rotation of cert-controller's own meanwhile.
		CaCertDuration: 3 * time.Minute, ServerCertDuration: 3 * time.Minute,
		LookaheadInterval: 10 * time.Second, RotationCheckFrequency: time.Hour,
	}))
	mgrCtx, stopMgr := context.WithCancel(e.ctx)
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()

	// The kubelet's part: the Secret's keys as files in the pod.
	var secretData map[string][]byte
	waitUntil(t, "cert-controller's Secret", time.Minute, func() bool {
		s, err := e.client.CoreV1().Secrets(ns).Get(e.ctx, secretName, metav1.GetOptions{})
		require.NoError(t, err)
		secretData = s.Data
		return len(s.Data["tls.crt"]) > 0 && len(s.Data["tls.key"]) > 0
	})
	for _, k := range []string{"tls.crt", "tls.key"} {
		require.NoError(t, os.WriteFile(filepath.Join(certDir, k), secretData[k], 0o600))
	}
	cw, err := certwatcher.New(filepath.Join(certDir, "tls.crt"), filepath.Join(certDir, "tls.key"))
	require.NoError(t, err)
	cwCtx, stopCW := context.WithCancel(e.ctx)
	t.Cleanup(stopCW)
	go func() { _ = cw.Start(cwCtx) }()
	e.front.use(cw.GetCertificate)
	select {
	case <-ready:
	case <-time.After(2 * time.Minute):
		t.Fatal("cert-controller never became ready (certs mounted, caBundle injected)")
	}
	e.waitForWebhook()

	e.migrate("cert-controller", authority.LayoutCertController, func() {
		// The old tool stops rotating; its pods keep serving the files
		// they have until the front switches (the rolling update).
		stopMgr()
		require.NoError(t, <-mgrDone)
	})
}
