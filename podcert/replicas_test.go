package podcert

import (
	"crypto/x509"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
)

// TestSignerConflictMeansSomeoneElseDecided: another signer replica writes
// the final status between this replica's decision and its write. The write
// conflicts; the replica reads the request again, finds it decided, counts
// a conflict, and writes nothing more: the other decision stands.
func TestSignerConflictMeansSomeoneElseDecided(t *testing.T) {
	e := newEnv(t)
	var once sync.Once
	e.api.before = func(obj *certificatesv1.PodCertificateRequest) error {
		var err error
		once.Do(func() {
			other := obj.DeepCopy()
			other.Status = condition(certificatesv1.PodCertificateRequestConditionTypeDenied, "DecidedElsewhere", "another replica", e.clk.Now())
			e.api.mu.Lock()
			e.api.rv++
			other.ResourceVersion = strconv.Itoa(e.api.rv)
			require.NoError(t, e.api.Tracker().Update(pcrResource, other, other.Namespace))
			e.api.mu.Unlock()
			err = apierrors.NewConflict(pcrResource.GroupResource(), obj.Name, assert.AnError)
		})
		return err
	}
	issued := certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateIssued)
	conflicts := certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateConflict)
	e.signer(e.ca, webPolicy)
	pcr, _ := e.request(e.pod("web-1", "web", map[string]string{"app": "web"}), KeyTypeECDSAP256)

	require.Eventually(t, func() bool {
		return certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateConflict) == conflicts+1
	}, guard, time.Millisecond, "counted as a conflict")
	got := e.final(pcr)
	assert.Equal(t, "DecidedElsewhere", got.Status.Conditions[0].Reason, "the other replica's decision stands")
	assert.Empty(t, got.Status.CertificateChain)
	assert.EqualValues(t, 1, e.api.attempts.Load(), "no second write after the conflict")
	assert.Equal(t, issued, certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateIssued), "not counted as issued")
}

// barrier holds each replica's SignLeaf until the other replica has decided
// the same request too, so both always write.
type barrier struct {
	t       *testing.T
	mu      sync.Mutex
	arrived map[string]chan struct{} // by public key
}

// barrierCA is one replica's CA behind the shared barrier.
type barrierCA struct {
	LeafSigner
	b *barrier
}

func (c barrierCA) SignLeaf(req authority.LeafRequest) (*authority.SignedLeaf, error) {
	der, err := x509.MarshalPKIXPublicKey(req.PublicKey)
	require.NoError(c.b.t, err)
	k := string(der)
	c.b.mu.Lock()
	ch, second := c.b.arrived[k]
	if !second {
		ch = make(chan struct{})
		c.b.arrived[k] = ch
	}
	c.b.mu.Unlock()
	if second {
		close(ch)
	} else {
		select {
		case <-ch:
		case <-time.After(guard):
			c.b.t.Errorf("the other replica never decided the request")
		}
	}
	return c.LeafSigner.SignLeaf(req)
}

// TestTwoSignersIssueOnce: two Signer replicas, each with its own Authority
// replica on the same CA Secret, run side by side. Both decide every
// request and both write its status (a barrier in front of their CAs makes
// sure); exactly one write succeeds, the other replica counts a conflict,
// and the leaf verifies against the shared bundle.
func TestTwoSignersIssueOnce(t *testing.T) {
	e := newEnv(t)
	b := e.authority("replica-b")
	bar := &barrier{t: t, arrived: map[string]chan struct{}{}}
	issued := certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateIssued)
	conflicts := certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateConflict)
	e.signer(barrierCA{e.ca, bar}, webPolicy)
	e.signer(barrierCA{b, bar}, webPolicy)
	pod := e.pod("web-1", "web", map[string]string{"app": "web"})

	const n = 10
	for i := range n {
		pcr, _ := e.request(pod, KeyTypeECDSAP256)
		leaf := issuedLeaf(t, e.final(pcr))
		assert.Equal(t, e.ca.Status().Signing.Serial, signedBy(t, leaf, b.CurrentCABundleContent()))
		assert.Equal(t, 1, e.api.writes(pcr.Name), "request %d: one status write", i)
	}
	require.Eventually(t, func() bool {
		return certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateConflict) == conflicts+n
	}, guard, time.Millisecond, "one conflict per request")
	// The winner counts its issuance after its write returns, which can be
	// after the request is seen final: wait for the count, do not race it.
	require.Eventually(t, func() bool {
		return certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateIssued) == issued+n
	}, guard, time.Millisecond, "one issuance counted per request")
	assert.EqualValues(t, 2*n, e.api.attempts.Load(), "both replicas wrote every request once")
}

// TestSignerFailsAfterRepeatedRejections: the API server refuses the issued
// status as invalid (as it does when this replica's clock is more than 5
// minutes off its own). The signer retries with backoff on its clock, then
// marks the request Failed with the API's message, so the kubelet reports
// it on the pod instead of waiting forever; counted and sent as an Event.
func TestSignerFailsAfterRepeatedRejections(t *testing.T) {
	e := newEnv(t)
	e.api.before = func(obj *certificatesv1.PodCertificateRequest) error {
		if obj.Status.Conditions[0].Type != certificatesv1.PodCertificateRequestConditionTypeIssued {
			return nil
		}
		return apierrors.NewInvalid(certificatesv1.Kind("PodCertificateRequest"), obj.Name, field.ErrorList{
			field.Invalid(field.NewPath("status", "notBefore"), obj.Status.NotBefore, "must be set to within 5 minutes of kube-apiserver's current time"),
		})
	}
	failed := certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateFailed)
	rec := recorder()
	e.signer(e.ca, webPolicy, func(c *SignerConfig) { c.EventRecorder = rec })
	pcr, _ := e.request(e.pod("web-1", "web", map[string]string{"app": "web"}), KeyTypeECDSAP256)

	var got *certificatesv1.PodCertificateRequest
	require.Eventually(t, func() bool {
		// Retries wait on the signer's clock.
		e.clk.Step(time.Minute)
		cur, err := e.api.CertificatesV1().PodCertificateRequests(testNS).Get(t.Context(), pcr.Name, metav1.GetOptions{})
		require.NoError(t, err)
		got = cur
		return final(cur)
	}, guard, 10*time.Millisecond, "the request is decided")
	c := got.Status.Conditions[0]
	assert.Equal(t, certificatesv1.PodCertificateRequestConditionTypeFailed, c.Type)
	assert.Equal(t, ReasonStatusRejected, c.Reason)
	assert.Contains(t, c.Message, "within 5 minutes")
	assert.EqualValues(t, maxAttempts+1, e.api.attempts.Load(), "three issued writes refused, then the Failed one")
	require.Eventually(t, func() bool {
		return certmetricstest.PodCertificateRequests(t, testSigner, certmetrics.PodCertificateFailed) == failed+1
	}, guard, time.Millisecond)
	select {
	case ev := <-rec.Events:
		assert.Contains(t, ev, "Warning "+ReasonStatusRejected)
	case <-time.After(guard):
		t.Fatal("no Event for the failure")
	}
}
