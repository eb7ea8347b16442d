package certmetrics_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
)

func TestCertificateLoadedCountsRotations(t *testing.T) {
	const p = "metrics-test"
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	rotationsBefore, errorsBefore := certmetricstest.Rotations(t, p), certmetricstest.LoadErrors(t, p)
	certmetrics.CertificateLoaded(p, at, false)
	assert.Equal(t, rotationsBefore, certmetricstest.Rotations(t, p), "the first load is not a rotation")
	assert.Equal(t, errorsBefore, certmetricstest.LoadErrors(t, p))
	assert.Equal(t, float64(at.Unix()), certmetricstest.Value(t, "evercert_certificate_expiration_timestamp_seconds", map[string]string{"provider": p}))

	certmetrics.CertificateLoaded(p, at.Add(time.Hour), true)
	assert.Equal(t, rotationsBefore+1, certmetricstest.Rotations(t, p))
	assert.Equal(t, float64(at.Add(time.Hour).Unix()), certmetricstest.Value(t, "evercert_certificate_expiration_timestamp_seconds", map[string]string{"provider": p}))

	certmetrics.LoadError(p)
	assert.Equal(t, errorsBefore+1, certmetricstest.LoadErrors(t, p))
	certmetrics.LoopbackSelfcheck(true)
	certmetrics.LoopbackSelfcheck(false)
	assert.Equal(t, 1.0, certmetricstest.Value(t, "evercert_loopback_selfcheck_total", map[string]string{"result": "error"}))
	certmetrics.CABundlePublished("APIService", "success")
	assert.Equal(t, 1.0, certmetricstest.Value(t, "evercert_cabundle_publish_total", map[string]string{"kind": "APIService", "result": "success"}))
}

func TestPodCertificateRequestDone(t *testing.T) {
	const signer = "metrics-test.evercert.io/serving"
	certmetrics.PodCertificateSignerStarted(signer)
	assert.Zero(t, certmetricstest.PodCertificateRequests(t, signer, certmetrics.PodCertificateDenied))
	certmetrics.PodCertificateRequestDone(signer, certmetrics.PodCertificateIssued, 20*time.Millisecond)
	certmetrics.PodCertificateRequestDone(signer, certmetrics.PodCertificateIssued, 30*time.Millisecond)
	certmetrics.PodCertificateRequestDone(signer, certmetrics.PodCertificateConflict, time.Millisecond)
	assert.Equal(t, 2.0, certmetricstest.PodCertificateRequests(t, signer, certmetrics.PodCertificateIssued))
	assert.Equal(t, 1.0, certmetricstest.PodCertificateRequests(t, signer, certmetrics.PodCertificateConflict))
	assert.EqualValues(t, 2, certmetricstest.HistogramCount(t, "evercert_podcertificate_request_duration_seconds",
		map[string]string{"signer": signer, "result": certmetrics.PodCertificateIssued}))
}
