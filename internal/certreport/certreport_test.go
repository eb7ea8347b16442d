package certreport_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
	"github.com/evercert/evercert/internal/klogtest"
	"github.com/evercert/evercert/internal/pki"
)

// TestFailedCountsDistinctFailures: a failure is counted, logged and sent
// once; repeating it (same message, same content) changes nothing but
// LastError; a different message, different content with the same message,
// or the same failure after a success is another failure.
func TestFailedCountsDistinctFailures(t *testing.T) {
	logs := klogtest.Capture(t)
	rec := certreporttest.NewRecorder()
	r := certreport.New(t.Name(), rec, certreporttest.Pod)
	before := certmetricstest.LoadErrors(t, t.Name())
	errs := func() float64 { return certmetricstest.LoadErrors(t, t.Name()) - before }
	bad := errors.New("file a.crt: malformed PEM")

	assert.True(t, r.Failed(certreport.WithContent(bad, []byte("x"), []byte("key"))))
	for range 5 {
		assert.False(t, r.Failed(fmt.Errorf("%w", certreport.WithContent(bad, []byte("x"), []byte("key")))), "a retry of the same content")
	}
	assert.Equal(t, 1.0, errs())
	assert.True(t, r.Failed(certreport.WithContent(bad, []byte("y"), []byte("key"))), "other content, same message")
	assert.True(t, r.Failed(certreport.WithContent(bad, []byte("x"), []byte("ke"), []byte("y"))), "the content's parts are told apart")
	assert.True(t, r.Failed(errors.New("forbidden")), "another error")
	assert.False(t, r.Failed(errors.New("forbidden")), "the same error without content")
	assert.Equal(t, 4.0, errs())
	assert.EqualError(t, r.LastError(), "forbidden")

	assert.True(t, r.Succeeded(), "recovered")
	assert.NoError(t, r.LastError())
	assert.False(t, r.Succeeded())
	assert.True(t, r.Failed(errors.New("forbidden")), "after a success the same failure counts again")
	assert.Equal(t, 5.0, errs())

	assert.Equal(t, 5, logs.Count("level=ERROR", "Rejected new content", "provider="+t.Name()))
	got := certreporttest.Drain(rec)
	require.Len(t, got, 5)
	for _, e := range got {
		assert.True(t, strings.HasPrefix(e, "Warning CertificateLoadFailed Load provider "+t.Name()+": "), e)
	}
}

// TestLastErrorIsCountedFirst: whoever sees a failure in LastError (a
// health check, a test polling for it) finds it counted in the load-error
// metric already. Failures are reported by one goroutine while another
// polls; before, LastError showed a failure while it was being logged,
// before it was counted, and a reader saw the count lag behind.
func TestLastErrorIsCountedFirst(t *testing.T) {
	klogtest.Capture(t)
	r := certreport.New(t.Name(), nil, nil)
	before := certmetricstest.LoadErrors(t, t.Name())
	const failures = 300
	done := make(chan struct{})
	lagged := make(chan string, 1)
	go func() {
		defer close(lagged)
		for {
			select {
			case <-done:
				return
			default:
			}
			err := r.LastError()
			if err == nil {
				continue
			}
			var n int
			if _, scanErr := fmt.Sscanf(err.Error(), "failure %d", &n); scanErr != nil {
				lagged <- fmt.Sprintf("unexpected error %v", err)
				return
			}
			if counted := certmetricstest.LoadErrors(t, t.Name()) - before; counted < float64(n) {
				lagged <- fmt.Sprintf("LastError showed failure %d while %v were counted", n, counted)
				return
			}
		}
	}()
	for i := 1; i <= failures; i++ {
		require.True(t, r.Failed(fmt.Errorf("failure %d", i)))
	}
	close(done)
	if msg, ok := <-lagged; ok {
		t.Fatal(msg)
	}
	assert.Equal(t, float64(failures), certmetricstest.LoadErrors(t, t.Name())-before)
}

// TestWithContentKeepsTheError: the marked error reads and unwraps as the
// original.
func TestWithContentKeepsTheError(t *testing.T) {
	err := certreport.WithContent(fmt.Errorf("reading: %w", pki.ErrNotYetValid), []byte("pem"))
	assert.EqualError(t, err, "reading: "+pki.ErrNotYetValid.Error())
	assert.ErrorIs(t, err, pki.ErrNotYetValid)
	assert.NoError(t, certreport.WithContent(nil, []byte("pem")))
}

// TestLoadedReportsEachChange: the first certificate is logged and sets the
// expiration, each later one is a rotation with a Normal Event; the line
// says which certificate without any key material.
func TestLoadedReportsEachChange(t *testing.T) {
	logs := klogtest.Capture(t)
	rec := certreporttest.NewRecorder()
	r := certreport.New(t.Name(), rec, certreporttest.Pod)
	before := certmetricstest.Rotations(t, t.Name())
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ca, err := pki.NewCA(pki.Request{CommonName: "test-ca@1", Now: now, Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	leaf := func() *pki.Issued {
		l, err := pki.IssueLeaf(ca, pki.Request{CommonName: "svc.test", Now: now, Lifetime: time.Hour})
		require.NoError(t, err)
		return l
	}

	first, second := leaf(), leaf()
	r.Loaded(first.Cert, "source", "test")
	assert.Equal(t, before, certmetricstest.Rotations(t, t.Name()))
	assert.Empty(t, certreporttest.Drain(rec), "the first certificate is not a rotation")
	r.Loaded(second.Cert, "source", "test")
	assert.Equal(t, before+1, certmetricstest.Rotations(t, t.Name()))
	assert.Equal(t, float64(second.Cert.NotAfter.Unix()),
		certmetricstest.Value(t, "evercert_certificate_expiration_timestamp_seconds", map[string]string{"provider": t.Name()}))
	got := certreporttest.Drain(rec)
	require.Len(t, got, 1)
	assert.Equal(t, fmt.Sprintf(`Normal CertificateRotated Rotate provider %s serves a new certificate: subject "svc.test", serial %s, issuer "test-ca@1", valid until 2030-01-01T01:00:00Z {kind=Pod,apiVersion=v1}`,
		t.Name(), second.Cert.SerialNumber.Text(16)), got[0])

	lines := logs.Lines(`msg="Loaded certificate"`)
	require.Len(t, lines, 2)
	assert.Contains(t, lines[1], fmt.Sprintf("provider=%s subject=svc.test serial=%s notAfter=2030-01-01T01:00:00Z issuer=test-ca@1 rotated=true source=test",
		t.Name(), second.Cert.SerialNumber.Text(16)))
	assert.NotContains(t, logs.String(), "PRIVATE KEY")
}

// TestEventNoteIsCut: a note longer than the API accepts is cut, not
// dropped.
func TestEventNoteIsCut(t *testing.T) {
	rec := events.NewFakeRecorder(1)
	r := certreport.New("p", rec, certreporttest.Pod)
	r.Event(corev1.EventTypeWarning, certreport.ReasonCertificateLoadFailed, certreport.ActionLoad, strings.Repeat("x", 5000))
	e := <-rec.Events
	note := strings.TrimPrefix(e, "Warning CertificateLoadFailed ")
	assert.Len(t, note, 1024)
	assert.True(t, strings.HasSuffix(note, "..."))

	// Without an object there is nothing to attach Events to.
	certreport.New("p", rec, nil).Event(corev1.EventTypeNormal, certreport.ReasonCertificateRotated, certreport.ActionRotate, "x")
	assert.Empty(t, rec.Events)
}
