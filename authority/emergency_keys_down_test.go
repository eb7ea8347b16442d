package authority

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
	"github.com/evercert/evercert/internal/pki"
)

// downKeys is memKeys whose keys refuse to sign while down is set: a key
// store (an HSM) that stops answering.
type downKeys struct {
	*memKeys
	down *atomic.Bool
}

func (d downKeys) NewKey(ctx context.Context, kt dynamiccert.KeyType) (crypto.Signer, string, error) {
	k, ref, err := d.memKeys.NewKey(ctx, kt)
	return downSigner{k, d.down}, ref, err
}

func (d downKeys) FindKey(ctx context.Context, ref string) (crypto.Signer, error) {
	k, err := d.memKeys.FindKey(ctx, ref)
	return downSigner{k, d.down}, err
}

type downSigner struct {
	crypto.Signer
	down *atomic.Bool
}

func (s downSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if s.down.Load() {
		return nil, errors.New("key store down (test)")
	}
	return s.Signer.Sign(r, digest, opts)
}

// TestEmergencySigningEventWhileTheKeyStoreIsDown: an emergency's
// successor is promoted while the CA key store cannot sign (an HSM that
// stopped answering), so the promotion is written but the leaf of the new
// CA cannot be signed yet. The Warning Event that says the successor signs
// in place of the compromised CA, and its step metric, must still be
// reported, once: the check returned at the failed leaf before it
// reported them, and the next check's decision starts its notes afresh,
// so they were lost.
func TestEmergencySigningEventWhileTheKeyStoreIsDown(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	recorder := certreporttest.NewRecorder()
	var down atomic.Bool
	a, err := New(Config{
		Name: "keys-down", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "r0",
		Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: clk,
		CAKeys:        downKeys{&memKeys{keys: map[string]crypto.Signer{}}, &down},
		EventRecorder: recorder, EventObject: certreporttest.Pod,
	})
	require.NoError(t, err)
	// An observer (a caBundle publisher) holds the successor back until the
	// test confirms it: the key store goes down in between.
	obs := &testObserver{}
	obs.set(true)
	a.AddObserver(obs)
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	secret := func() *corev1.Secret {
		s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
		require.NoError(t, err)
		return s
	}
	signingCA := func() *x509.Certificate {
		cas, err := pki.ParseCABundle(secret().Data[corev1.TLSCertKey])
		require.NoError(t, err)
		return cas[0]
	}
	signing := func() string { return Fingerprint(signingCA()) }
	compromised := signing()
	obs.set(false)
	for {
		s := secret()
		s.Annotations[CompromisedCAAnnotation] = compromised
		if _, err := client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
			require.NoError(t, err)
			break
		}
	}
	step := func() {
		clk.Step(time.Second)
		waitWaiters(t, clk, 2) // the issuer and the Lease loop
	}
	deadline := clk.Now().Add(10 * time.Minute)
	for a.Status().Successor == nil {
		require.True(t, clk.Now().Before(deadline), "no successor published after the mark")
		step()
	}
	down.Store(true)
	obs.set(true)
	for signing() == compromised {
		require.True(t, clk.Now().Before(deadline), "the emergency's successor never promoted while the key store was down")
		step()
	}
	successor := signingCA()
	for range 10 {
		step() // checks fail at the leaf, with backoff; the notes of each start afresh
	}
	require.False(t, signedBy(a.Leaf(), successor), "a leaf of the successor signed while the key store was down")
	down.Store(false)
	for !signedBy(a.Leaf(), successor) {
		require.True(t, clk.Now().Before(deadline.Add(10*time.Minute)), "no leaf of the successor after the key store came back")
		step()
	}
	signs := 0
	for _, e := range certreporttest.Drain(recorder) {
		if strings.Contains(e, "signs in place of compromised CA") {
			signs++
		}
	}
	assert.Equal(t, 1, signs, "Warning Events saying the emergency's successor signs")
	assert.Equal(t, 1.0, certmetricstest.Value(t, "evercert_emergency_rotation_steps_total", map[string]string{"provider": a.Name(), "step": emergencySigning}),
		"the emergency's signing step in evercert_emergency_rotation_steps_total")
}
