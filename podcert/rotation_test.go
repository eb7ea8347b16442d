package podcert

import (
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
)

func issuedLeaf(t *testing.T, pcr *certificatesv1.PodCertificateRequest) *x509.Certificate {
	t.Helper()
	require.Len(t, pcr.Status.Conditions, 1)
	require.Equal(t, certificatesv1.PodCertificateRequestConditionTypeIssued, pcr.Status.Conditions[0].Type, pcr.Status.Conditions[0].Message)
	block, _ := pem.Decode([]byte(pcr.Status.CertificateChain))
	require.NotNil(t, block)
	leaf, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	return leaf
}

// TestSignerThroughObservedRotation runs the Authority's and the Signer's
// real loops on a fake clock through a CA rotation whose observer holds the
// successor back. While the successor is only published, leaves come from
// the old CA, capped at its expiry with beginRefreshAt still where the API
// wants it; once the old CA has less than MinLifetime left, a request
// waits (neither denied nor failed: the kubelet would give up on it);
// when the observer confirms, the Authority promotes the successor, tells
// the Signer, and the waiting request is issued by the successor at once
// (the clock does not move, so no retry timer does it).
func TestSignerThroughObservedRotation(t *testing.T) {
	e := newEnv(t)
	s := e.signer(e.ca, webPolicy)
	pod := e.pod("web-1", "web", map[string]string{"app": "web"})
	first := e.ca.Status().Signing
	e.obs.set(false)

	// Past the CA's renew-before: the successor is published.
	e.clk.SetTime(first.NotAfter.Add(-16*time.Hour + time.Minute))
	// Kicking the Authority's loop on every poll: a fake-clock step that
	// lands between its check and its next timer would otherwise leave that
	// timer a whole wait beyond the new time.
	require.Eventually(t, func() bool { e.ca.Enqueue(); return e.ca.Status().Successor != nil }, guard, time.Millisecond, "the successor is published")
	succ := e.ca.Status().Successor
	// Its minimum delay is long over, but the observer holds it back.
	e.clk.SetTime(first.NotAfter.Add(-10 * time.Hour))
	require.Equal(t, first.Serial, e.ca.Status().Signing.Serial, "the successor must not sign unobserved")

	pcr, _ := e.request(pod, KeyTypeECDSAP256)
	leaf := issuedLeaf(t, e.final(pcr))
	got := e.final(pcr)
	assert.Equal(t, first.Serial, signedBy(t, leaf, e.ca.CurrentCABundleContent()), "signed by the observed CA, not the published successor")
	assert.Equal(t, first.NotAfter, leaf.NotAfter, "capped at the signing CA's expiry")
	assert.Less(t, leaf.NotAfter.Sub(leaf.NotBefore), 24*time.Hour)
	refresh := got.Status.BeginRefreshAt.Time
	assert.Equal(t, leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore)*2/3).Truncate(time.Second), refresh)
	assert.False(t, refresh.Before(leaf.NotBefore.Add(10*time.Minute)))
	assert.False(t, refresh.After(leaf.NotAfter.Add(-10*time.Minute)))

	// Less than MinLifetime left: wait for the successor.
	e.clk.SetTime(first.NotAfter.Add(-30 * time.Minute))
	require.Eventually(t, func() bool { e.ca.Enqueue(); return e.ca.Status().Stalled }, guard, time.Millisecond, "the Authority saw the time")
	waiting, _ := e.request(pod, KeyTypeECDSAP256)
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.waiting[key(waiting)]
		return ok
	}, guard, time.Millisecond, "the request waits for the CA")
	cur, err := e.api.CertificatesV1().PodCertificateRequests(testNS).Get(t.Context(), waiting.Name, metav1GetOptions())
	require.NoError(t, err)
	require.False(t, final(cur), "a request the CA cannot serve yet stays open")

	e.obs.set(true)
	leaf = issuedLeaf(t, e.final(waiting))
	assert.Equal(t, succ.Serial, e.ca.Status().Signing.Serial)
	assert.Equal(t, succ.Serial, signedBy(t, leaf, e.ca.CurrentCABundleContent()), "issued by the successor once observed")
	assert.Equal(t, 24*time.Hour, leaf.NotAfter.Sub(leaf.NotBefore))
	assert.Zero(t, e.ca.Status().UnsafeRotations)
}
