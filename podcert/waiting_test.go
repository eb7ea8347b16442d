package podcert

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
)

// TestSignerWaitingShowsInReadinessAndMetric runs the Authority's and the
// Signer's real loops (informer, work queue, workers) on a fake clock and
// fake clientset. A request that must wait for the CA (the signing CA ends
// in less than MinLifetime and the observer holds its successor back) fails
// the Signer's readiness check, naming the request and why, and counts in
// evercert_podcertificate_requests_waiting; once the successor is observed
// and the request issued, both clear.
func TestSignerWaitingShowsInReadinessAndMetric(t *testing.T) {
	e := newEnv(t)
	s := e.signer(e.ca, webPolicy)
	check := s.HealthCheck()
	assert.Equal(t, "podcert-waiting:"+testSigner, check.Name())
	require.NoError(t, check.Check(nil), "nothing waits yet")
	gauge := func() float64 {
		return certmetricstest.Value(t, "evercert_podcertificate_requests_waiting", map[string]string{"signer": testSigner})
	}
	assert.Zero(t, gauge())

	pod := e.pod("web-1", "web", map[string]string{"app": "web"})
	first := e.ca.Status().Signing
	e.obs.set(false)
	// The successor is published (16h before expiry) and its minimum delay
	// passes, but the observer holds it back until the signing CA has less
	// than MinLifetime left.
	// Each wait kicks the Authority's loop: a fake-clock step that lands
	// between its check and its next timer would otherwise leave that timer
	// a whole wait beyond the new time.
	e.clk.SetTime(first.NotAfter.Add(-16*time.Hour + time.Minute))
	require.Eventually(t, func() bool { e.ca.Enqueue(); return e.ca.Status().Successor != nil }, guard, time.Millisecond, "the successor is published")
	e.clk.SetTime(first.NotAfter.Add(-30 * time.Minute))
	require.Eventually(t, func() bool { e.ca.Enqueue(); return e.ca.Status().Stalled }, guard, time.Millisecond, "the Authority saw the time")
	waiting, _ := e.request(pod, KeyTypeECDSAP256)
	require.Eventually(t, func() bool { return check.Check(nil) != nil }, guard, time.Millisecond, "readiness fails while the request waits")
	err := check.Check(nil)
	assert.ErrorContains(t, err, "1 PodCertificateRequest(s) wait for the CA")
	assert.ErrorContains(t, err, key(waiting))
	assert.ErrorContains(t, err, "less than the 1h0m0s asked for")
	assert.Equal(t, 1.0, gauge())
	assert.Equal(t, []string{key(waiting)}, s.Waiting())

	e.obs.set(true)
	issuedLeaf(t, e.final(waiting))
	require.Eventually(t, func() bool { return check.Check(nil) == nil }, guard, time.Millisecond, "readiness passes once the request is issued")
	assert.Zero(t, gauge())
	assert.Empty(t, s.Waiting())
}
