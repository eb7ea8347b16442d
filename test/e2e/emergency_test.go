//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/example/webhook/app"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
)

// TestE2EEmergencyRotation: three replicas of the example webhook, each
// called by the real kube-apiserver through its own webhook configuration
// (each publishing its caBundle), share an Authority whose minimum
// propagation delay is about 35 minutes. ConfigMaps are created
// throughout. The operator marks the signing CA compromised on the CA
// Secret. Within seconds the compromised CA is gone from ca.crt and from
// every caBundle, the Secret records it handled, every replica serves a
// leaf that a client trusting only the compromised CA rejects, and no
// admission failed.
func TestE2EEmergencyRotation(t *testing.T) {
	t.Parallel() // reads no process-global metric: see main_test.go
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: webhookUser}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	webhookNamespaces(t, admin)
	applyWebhookRBAC(t, admin, webhookUser, webhookCASecret, "webhook-a", "webhook-b", "webhook-c")
	kubeconfig := writeKubeconfig(t, cluster.UserConfig(webhookUser))

	lifetimes := []string{"--self-signed-validity=1h"}
	replicas := []*app.Webhook{
		startWebhookReplica(t, kubeconfig, append(lifetimes, "--validating-webhook-configuration=webhook-a", "--mutating-webhook-configuration=")...),
		startWebhookReplica(t, kubeconfig, append(lifetimes, "--validating-webhook-configuration=", "--mutating-webhook-configuration=webhook-b")...),
		startWebhookReplica(t, kubeconfig, append(lifetimes, "--validating-webhook-configuration=webhook-c", "--mutating-webhook-configuration=")...),
	}
	waitReady(t, replicas...)
	ctx := context.Background()
	caBundles := func() map[string][]byte {
		out := map[string][]byte{}
		for _, name := range []string{"webhook-a", "webhook-c"} {
			if v, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{}); err == nil && len(v.Webhooks) > 0 {
				out["ValidatingWebhookConfiguration/"+name] = v.Webhooks[0].ClientConfig.CABundle
			}
		}
		if m, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "webhook-b", metav1.GetOptions{}); err == nil && len(m.Webhooks) > 0 {
			out["MutatingWebhookConfiguration/webhook-b"] = m.Webhooks[0].ClientConfig.CABundle
		}
		return out
	}

	// Admissions through every replica, throughout.
	cms := admin.CoreV1().ConfigMaps(webhookEnabledNS)
	stop := make(chan struct{})
	var created, failed atomic.Int64
	var failMu sync.Mutex
	var failures []string
	var wg sync.WaitGroup
	for wk := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				reqCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
				cm, err := cms.Create(reqCtx, newConfigMap(fmt.Sprintf("emergency-%d-%05d", wk, i), true), metav1.CreateOptions{})
				cancel()
				if err == nil && cm.Annotations[app.DefaultedAnnotation] == "true" {
					created.Add(1)
					continue
				}
				failed.Add(1)
				failMu.Lock()
				failures = append(failures, fmt.Sprintf("%s emergency-%d-%05d: %v", time.Now().Format("15:04:05.000"), wk, i, err))
				failMu.Unlock()
			}
		})
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	time.Sleep(2 * time.Second)

	secrets := admin.CoreV1().Secrets(ns)
	secret, err := secrets.Get(ctx, webhookCASecret, metav1.GetOptions{})
	require.NoError(t, err)
	cas, err := pki.ParseCABundle(secret.Data["tls.crt"])
	require.NoError(t, err)
	bad := cas[0]
	fp := authority.Fingerprint(bad)
	for name, b := range caBundles() {
		require.True(t, holdsFingerprint(b, fp), "%s holds the signing CA before the mark", name)
	}
	marked := time.Now()
	for {
		if secret.Annotations == nil {
			secret.Annotations = map[string]string{}
		}
		secret.Annotations[authority.CompromisedCAAnnotation] = fp
		secret.Annotations[authority.CompromisedReasonAnnotation] = "e2e: key leaked"
		secret.Annotations[authority.CompromisedAtAnnotation] = marked.UTC().Format(time.RFC3339)
		_, err = secrets.Update(ctx, secret, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			require.NoError(t, err)
			break
		}
		secret, err = secrets.Get(ctx, webhookCASecret, metav1.GetOptions{})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		s, err := secrets.Get(ctx, webhookCASecret, metav1.GetOptions{})
		if err != nil || s.Annotations[authority.CompromisedHandledAnnotation] != fp || holdsFingerprint(s.Data["ca.crt"], fp) {
			return false
		}
		for _, b := range caBundles() {
			if holdsFingerprint(b, fp) {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "the compromised CA gone from ca.crt and every caBundle")
	took := time.Since(marked)
	t.Logf("emergency rotation: compromised CA untrusted everywhere (ca.crt and 3 caBundles) %v after the mark", took.Round(time.Millisecond))

	// A client that trusts only the compromised CA fails on every replica.
	onlyBad := x509.NewCertPool()
	onlyBad.AddCert(bad)
	for n, r := range replicas {
		_, err := tlstest.Handshake(r.Addr().String(), &tls.Config{ServerName: "127.0.0.1", RootCAs: onlyBad})
		assert.Error(t, err, "replica %d still serves a leaf of the compromised CA", n)
	}
	time.Sleep(2 * time.Second) // admissions keep working after it
	close(stop)
	wg.Wait()
	t.Logf("emergency rotation: %d admissions, %d failed", created.Load(), failed.Load())
	for i, f := range failures {
		if i == 20 {
			break
		}
		t.Errorf("failed admission: %s", f)
	}
	assert.Zero(t, failed.Load(), "failed admissions")
	assert.Positive(t, created.Load())
}

func holdsFingerprint(bundle []byte, fp string) bool {
	cas, err := pki.ParseCABundle(bundle)
	return err == nil && slices.ContainsFunc(cas, func(c *x509.Certificate) bool { return authority.Fingerprint(c) == fp })
}
