package migrate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/evercert/evercert/authority"
)

// TestMigrateFromCertControllerWhileItRotates is issue 27 §8 bullet 1 on
// the real kube-apiserver: a rolling update straight from cert-controller
// AddRotator pods to evercert, so the old manager (its rotator and its
// caBundle injection) keeps running while the two evercert replicas start
// on its Secret. cert-controller answers every adoption at once with a new
// CA (its Secret reconciler regenerates a Secret without ca.key) and
// injects that CA alone into the webhook configuration.
//
// The old pods serve, during the overlap, the leaf the Secret held last in
// cert-controller's layout (the kubelet's copy and certwatcher, polled);
// the evercert replicas get no traffic during it (the front stands in for
// a rollout that has not moved traffic yet; their readiness stays green
// while held, so a real rollout would go on and remove the old pods). After the
// overlap the old manager stops, the replicas adopt its last CA once, the
// front switches to them once they are ready, and the first observed CA
// rotation runs: 0 failed webhook calls from the old manager's stop on,
// and ca.crt holds at most three CAs at the end. Calls during the overlap
// are counted and logged, not checked: cert-controller swaps each new CA
// alone into the caBundle while its own pods still serve the leaf before
// (see migrateWhileOldRuns).
func TestMigrateFromCertControllerWhileItRotates(t *testing.T) {
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
		// within a minute. cert-controller's rewrites during the overlap
		// come from its Secret reconciler answering each adoption.
		CaCertDuration: 3 * time.Minute, ServerCertDuration: 3 * time.Minute,
		LookaheadInterval: 10 * time.Second, RotationCheckFrequency: 20 * time.Second,
	}))
	mgrCtx, stopMgr := context.WithCancel(e.ctx)
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()

	// The old pods: the kubelet copies the Secret into their volume and
	// certwatcher loads it; a Secret in evercert's layout (tls.crt a CA)
	// is what they must never get to serve, and the docs ask for the old
	// pods to be gone before the kubelet's refresh: here they keep the
	// last leaf of cert-controller's layout.
	var oldLeaf atomic.Pointer[tls.Certificate]
	oldRewrites := atomic.Int64{}
	var lastOldCA atomic.Pointer[x509.Certificate]
	kubeletCtx, stopKubelet := context.WithCancel(e.ctx)
	kubeletDone := make(chan struct{})
	go func() {
		defer close(kubeletDone)
		var lastCA string
		for kubeletCtx.Err() == nil {
			s, err := e.client.CoreV1().Secrets(ns).Get(kubeletCtx, secretName, metav1.GetOptions{})
			if err == nil && len(s.Data["ca.key"]) > 0 && len(s.Data["tls.crt"]) > 0 {
				if pair, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"]); err == nil {
					oldLeaf.Store(&pair)
					// cert-controller is ready once its files are mounted.
					for _, k := range []string{"tls.crt", "tls.key"} {
						_ = os.WriteFile(filepath.Join(certDir, k), s.Data[k], 0o600)
					}
				}
				if ca := string(s.Data["ca.crt"]); ca != lastCA {
					lastCA = ca
					lastOldCA.Store(parsePEM(t, s.Data["ca.crt"])[0])
					oldRewrites.Add(1)
				}
			}
			select {
			case <-kubeletCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stopKubelet(); <-kubeletDone })
	oldPods := func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		if c := oldLeaf.Load(); c != nil {
			return c, nil
		}
		return nil, errors.New("the old pods have no leaf yet")
	}
	e.front.use(oldPods)
	select {
	case <-ready:
	case <-time.After(2 * time.Minute):
		t.Fatal("cert-controller never became ready (certs mounted, caBundle injected)")
	}
	e.waitForWebhook()

	e.migrateWhileOldRuns("cert-controller", authority.LayoutCertController, time.Minute, func() (int64, *x509.Certificate) { return oldRewrites.Load(), lastOldCA.Load() }, func() {
		stopMgr()
		require.NoError(t, <-mgrDone)
	})
}
