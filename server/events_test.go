package server

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
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// TestCASecretSendsEvents: a server built from --ca-secret (as the example
// webhook and signer build theirs) whose CA Secret marks compromised a
// fingerprint that names no CA in it. The Authority ignores the mark and
// says so: a Warning CARequestIgnored Event about the Secret, in its
// namespace, reaches the API server (the fake clientset).
func TestCASecretSendsEvents(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "events-ca", Now: now.Add(-time.Hour), Lifetime: 90 * 24 * time.Hour})
	require.NoError(t, err)
	const mistyped = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	client := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "certs", Name: "webhook-ca", Annotations: map[string]string{
			authority.CompromisedCAAnnotation: mistyped, authority.CompromisedReasonAnnotation: "drill",
		}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM, dynamiccert.SecretCAKey: ca.CertPEM},
	})
	o := NewOptions()
	o.CASecret = "certs/webhook-ca"
	o.SelfSignedHosts = []string{"webhook.certs.svc"}
	o.Clock = testingclock.NewFakeClock(now)
	s, err := o.build(func() (kubernetes.Interface, error) { return client, nil })
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, s.RunOnce(ctx))
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx, 1) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second): // a guard, not a timing assertion
			t.Error("Run did not return after its context ended")
		}
	})

	var ignored []eventsv1.Event
	require.Eventually(t, func() bool {
		list, err := client.EventsV1().Events("certs").List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		ignored = ignored[:0]
		for _, e := range list.Items {
			if e.Reason == dynamiccert.ReasonCARequestIgnored && e.Regarding.Kind == "Secret" && e.Regarding.Name == "webhook-ca" {
				ignored = append(ignored, e)
			}
		}
		return len(ignored) > 0
	}, 30*time.Second, 10*time.Millisecond, "a CARequestIgnored Event about the Secret, in its namespace")
	assert.Equal(t, corev1.EventTypeWarning, ignored[0].Type)
	assert.Contains(t, ignored[0].Note, mistyped)
	assert.Equal(t, EventsReportingController, ignored[0].ReportingController)
}
