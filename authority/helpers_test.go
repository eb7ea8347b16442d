package authority

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/evercert/evercert/internal/pki"
)

// The helpers the Authority's tests share with dynamiccert's (same names,
// same behaviour), which are in another package now.

var testNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func issueTestPair(t testing.TB, cn string, now time.Time, lifetime time.Duration) *pki.Issued {
	t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: cn + "-ca", Now: now, Lifetime: 10 * lifetime})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: cn, DNSNames: []string{cn}, Now: now, Lifetime: lifetime})
	require.NoError(t, err)
	return leaf
}

func tlsSecret(name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Type:       corev1.SecretTypeTLS,
		Data:       data,
	}
}

type countingListener struct{ n atomic.Int64 }

func (c *countingListener) Enqueue() { c.n.Add(1) }

func loadErrorCount(t testing.TB, provider string) float64 {
	t.Helper()
	values, err := testutil.GetCounterValuesFromGatherer(legacyregistry.DefaultGatherer,
		"evercert_certificate_load_errors_total", map[string]string{"provider": provider}, "provider")
	if err != nil {
		// Not registered or no series yet.
		return 0
	}
	return values[provider]
}
