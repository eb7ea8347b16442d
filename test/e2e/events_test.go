//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/example/webhook/app"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/testcluster"
)

// TestE2EEvents follows a Secret certificate source whose config has an
// EventRecorder writing to a real kube-apiserver: a new certificate in the
// Secret becomes a Normal CertificateRotated Event about the Secret, and bad
// content a Warning CertificateLoadFailed Event naming the Secret, read
// back through events.k8s.io/v1. The bad content, re-read at every resync,
// stays one Event and one load error.
func TestE2EEvents(t *testing.T) {
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: "reader"}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	reader := kubernetes.NewForConfigOrDie(cluster.UserConfig("reader"))
	setupNamespace(t, admin)
	grantSecret(t, admin, "reader", "events", []string{"get", "list", "watch"})
	ctx := context.Background()

	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: admin.EventsV1()})
	eventsCtx, stopEvents := context.WithCancel(ctx)
	require.NoError(t, broadcaster.StartRecordingToSinkWithContext(eventsCtx))
	t.Cleanup(func() { stopEvents(); broadcaster.Shutdown() })

	secrets := admin.CoreV1().Secrets(ns)
	first := newPair(t, "svc.test")
	_, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "events"}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	write := func(data map[string][]byte) {
		t.Helper()
		s, err := secrets.Get(ctx, "events", metav1.GetOptions{})
		require.NoError(t, err)
		s.Data = data
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		require.NoError(t, err)
	}

	const provider = "e2e-events"
	p, err := dynamiccert.NewSecretCertKey(dynamiccert.SecretConfig{
		Name: provider, Namespace: ns, SecretName: "events", Client: reader,
		// Resyncs re-read the bad content below, again and again.
		Resync:        time.Second,
		EventRecorder: broadcaster.NewRecorder(scheme.Scheme, "evercert-e2e"),
	})
	require.NoError(t, err)
	addr := serve(t, p)
	require.Equal(t, first.Cert.SerialNumber.String(), servedSerial(t, addr, "svc.test"))

	second := newPair(t, "svc.test")
	write(map[string][]byte{"tls.crt": second.CertPEM, "tls.key": second.KeyPEM})
	require.Eventually(t, func() bool { return servedSerial(t, addr, "svc.test") == second.Cert.SerialNumber.String() }, 5*time.Second, 5*time.Millisecond)

	before := certmetricstest.LoadErrors(t, provider)
	write(map[string][]byte{"tls.crt": []byte("garbage"), "tls.key": second.KeyPEM})
	require.Eventually(t, func() bool { return p.LastError() != nil }, 5*time.Second, 5*time.Millisecond)

	// The Events reach the cluster, about the Secret.
	var rotated, failed []eventsv1.Event
	require.Eventually(t, func() bool {
		list, err := admin.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		rotated, failed = nil, nil
		for _, e := range list.Items {
			if e.Regarding.Kind != "Secret" || e.Regarding.Name != "events" || e.Regarding.Namespace != ns {
				continue
			}
			switch e.Reason {
			case dynamiccert.ReasonCertificateRotated:
				rotated = append(rotated, e)
			case dynamiccert.ReasonCertificateLoadFailed:
				failed = append(failed, e)
			}
		}
		return len(rotated) > 0 && len(failed) > 0
	}, 30*time.Second, 100*time.Millisecond, "Events about the Secret")

	// Several resyncs have re-read the bad content by the time the served
	// certificate is checked a few times more; still one failure.
	for range 4 {
		require.Equal(t, second.Cert.SerialNumber.String(), servedSerial(t, addr, "svc.test"), "last good served")
		time.Sleep(time.Second) // the scenario's pace (resyncs), not an assertion
	}
	assert.Equal(t, before+1, certmetricstest.LoadErrors(t, provider), "the same bad content re-read is one load error")

	require.Len(t, rotated, 1, "one rotation, one Event")
	assert.Equal(t, corev1.EventTypeNormal, rotated[0].Type)
	assert.Equal(t, "Rotate", rotated[0].Action)
	assert.Contains(t, rotated[0].Note, second.Cert.SerialNumber.Text(16))
	assert.Equal(t, "evercert-e2e", rotated[0].ReportingController)

	list, err := admin.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	failed = nil
	for _, e := range list.Items {
		if e.Reason == dynamiccert.ReasonCertificateLoadFailed && e.Regarding.Name == "events" {
			failed = append(failed, e)
		}
	}
	require.Len(t, failed, 1, "one failure, one Event")
	assert.Equal(t, corev1.EventTypeWarning, failed[0].Type)
	assert.Nil(t, failed[0].Series, "not repeated")
	assert.Contains(t, failed[0].Note, "secret "+ns+"/events")
	assert.NotContains(t, failed[0].Note, "PRIVATE KEY")
}

// TestE2EWebhookReportsIgnoredMark: the example webhook, with the
// documented RBAC, keeps its CA in a Secret; the operator marks compromised
// a fingerprint that names no CA in it (mistyped). The Authority the
// webhook built ignores the mark and says so where the operator looks: a
// Warning CARequestIgnored Event about the Secret, in its namespace.
func TestE2EWebhookReportsIgnoredMark(t *testing.T) {
	t.Parallel() // reads no process-global metric: see main_test.go
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: webhookUser}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	webhookNamespaces(t, admin)
	applyWebhookRBAC(t, admin, webhookUser, webhookCASecret, app.DefaultConfigurationName)
	kubeconfig := writeKubeconfig(t, cluster.UserConfig(webhookUser))
	waitReady(t, startWebhookReplica(t, kubeconfig))

	ctx := context.Background()
	const mistyped = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := admin.CoreV1().Secrets(ns).Get(ctx, webhookCASecret, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[authority.CompromisedCAAnnotation] = mistyped
		s.Annotations[authority.CompromisedReasonAnnotation] = "drill"
		_, err = admin.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{})
		return err
	}))

	var ignored *eventsv1.Event
	require.Eventually(t, func() bool {
		list, err := admin.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		for i, e := range list.Items {
			if e.Reason == dynamiccert.ReasonCARequestIgnored && e.Regarding.Kind == "Secret" && e.Regarding.Name == webhookCASecret {
				ignored = &list.Items[i]
				return true
			}
		}
		return false
	}, time.Minute, 100*time.Millisecond, "a CARequestIgnored Event about the CA Secret in %s", ns)
	assert.Equal(t, corev1.EventTypeWarning, ignored.Type)
	assert.Contains(t, ignored.Note, mistyped)
}
