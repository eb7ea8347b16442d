package authority

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
	"github.com/evercert/evercert/internal/pki"
)

// TestBrokenSecretReportedWhileNobodyCanRepairIt (issue 27 §3): a replica
// that starts against a CA Secret broken by hand (tls.key is not the key of
// tls.crt) holds nothing to repair it with. For as long as that lasts its
// Status().Broken names the broken key (readiness is left to the schedule:
// every replica reads the same Secret, and failing them all at once would
// empty the Service), every
// failed check is counted in evercert_certificate_load_errors_total, and
// one Warning Event and one error log line report the episode. Once the
// operator fixes the Secret, the replica serves and is ready.
func TestBrokenSecretReportedWhileNobodyCanRepairIt(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	client := fake.NewClientset()
	ca, err := pki.NewCA(pki.Request{CommonName: "hand-made", Now: clk.Now(), Lifetime: 8 * time.Hour, Backdate: time.Hour})
	require.NoError(t, err)
	other, err := pki.NewCA(pki.Request{CommonName: "other", Now: clk.Now(), Lifetime: 8 * time.Hour, Backdate: time.Hour})
	require.NoError(t, err)
	_, err = client.CoreV1().Secrets("ns").Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca"},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: other.KeyPEM, dynamiccert.SecretCAKey: ca.CertPEM},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	rec := certreporttest.NewRecorder()
	const name = "handedit-fresh"
	a := attackAuthority(t, client, clk, name, func(c *Config) { c.EventRecorder = rec })
	errorsBefore := certmetricstest.LoadErrors(t, name)
	runInBackground(t, a.Run)
	waitFor(t, "the first check to fail", func() bool { return a.LastError() != nil })
	waitBlocked(t, clk)

	const checks = 6
	for range checks {
		clk.Step(time.Minute) // longer than the retry backoff's cap: one check each
		waitBlocked(t, clk)
	}
	s := a.Status()
	require.Nil(t, a.Leaf(), "a leaf from a Secret nobody could read")
	require.Contains(t, s.Broken, "tls.key", "Status().Broken while the CA Secret is broken and nobody holds what is missing; status %+v", s)
	require.NoError(t, RotationCheck(a).Check(nil), "ca-rotation readiness fails on a broken Secret, on every replica alike")
	require.GreaterOrEqual(t, certmetricstest.LoadErrors(t, name)-errorsBefore, float64(checks),
		"evercert_certificate_load_errors_total counts every failed check while the CA Secret is broken")
	var loadFailed []string
	for _, e := range certreporttest.Drain(rec) {
		if strings.Contains(e, " "+dynamiccert.ReasonCertificateLoadFailed+" ") {
			loadFailed = append(loadFailed, e)
		}
	}
	require.Len(t, loadFailed, 1, "one Warning Event for the episode, not one per check")

	// The operator fixes the key: the replica serves and is ready.
	s0, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	s0.Data[corev1.TLSPrivateKeyKey] = ca.KeyPEM
	_, err = client.CoreV1().Secrets("ns").Update(context.Background(), s0, metav1.UpdateOptions{})
	require.NoError(t, err)
	for a.Leaf() == nil {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
		require.True(t, clk.Since(testNow) < time.Hour, "no leaf after the Secret was fixed")
	}
	require.NoError(t, a.LastError())
	require.NoError(t, RotationCheck(a).Check(nil))
	require.False(t, a.Status().Stalled)
}
