package podcert

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// TestSignerLifetimes: the lifetime is the request's maxExpirationSeconds
// (24 h when unset), capped at the signer's MaxLifetime, with
// beginRefreshAt at two thirds.
func TestSignerLifetimes(t *testing.T) {
	e := newEnv(t)
	e.signer(e.ca, webPolicy, func(c *SignerConfig) { c.MaxLifetime = 30 * time.Hour })
	pod := e.pod("web-1", "web", map[string]string{"app": "web"})
	for _, tc := range []struct {
		maxExp *int32
		want   time.Duration
	}{
		{ptr.To[int32](7200), 2 * time.Hour},
		{nil, 24 * time.Hour},
		{ptr.To[int32](36 * 3600), 30 * time.Hour},
		{ptr.To[int32](91 * 24 * 3600), 30 * time.Hour},
	} {
		pcr, _ := e.request(pod, KeyTypeECDSAP256, func(p *certificatesv1.PodCertificateRequest) { p.Spec.MaxExpirationSeconds = tc.maxExp })
		got := e.final(pcr)
		leaf := issuedLeaf(t, got)
		assert.Equal(t, tc.want, leaf.NotAfter.Sub(leaf.NotBefore), "maxExpirationSeconds %v", tc.maxExp)
		assert.Equal(t, leaf.NotBefore.Add(tc.want*2/3), got.Status.BeginRefreshAt.Time)
	}
}

// TestSignerRetriesAPIErrors: the Pod cannot be read (the API server
// fails); the request is neither denied nor dropped but retried with
// backoff on the signer's clock, and issued once the API answers.
func TestSignerRetriesAPIErrors(t *testing.T) {
	e := newEnv(t)
	var gets atomic.Int64
	e.api.PrependReactor("get", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		if gets.Add(1) <= 2 {
			return true, nil, apierrors.NewInternalError(assert.AnError)
		}
		return false, nil, nil
	})
	e.signer(e.ca, webPolicy)
	pcr, _ := e.request(e.pod("web-1", "web", map[string]string{"app": "web"}), KeyTypeECDSAP256)
	require.Eventually(t, func() bool { return gets.Load() == 1 }, guard, time.Millisecond, "the first attempt")

	var got *certificatesv1.PodCertificateRequest
	require.Eventually(t, func() bool {
		e.clk.Step(time.Second) // the backoff waits on the signer's clock
		cur, err := e.api.CertificatesV1().PodCertificateRequests(testNS).Get(t.Context(), pcr.Name, metav1.GetOptions{})
		require.NoError(t, err)
		got = cur
		return final(cur)
	}, guard, 10*time.Millisecond)
	issuedLeaf(t, got)
	assert.EqualValues(t, 3, gets.Load(), "two failed reads, then the one that decided")
}
