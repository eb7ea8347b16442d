package authority

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
)

// TestAttackAPIOutageKeepsLeafFresh: the API server answers every read of
// the CA Secret with a 500 for twice the leaf lifetime, and the open watch
// breaks (the Authority reads the Secret from its watch while the watch is
// healthy; a GET only once it fails). The CA this replica
// holds (with its key) stays valid throughout, so the served leaf must keep
// being renewed from it: an API outage longer than a leaf lifetime must not
// take the serving certificate down with it.
func TestAttackAPIOutageKeepsLeafFresh(t *testing.T) {
	client := fake.NewClientset()
	gets := interceptSecrets(client, "get", nil)
	lists := interceptSecrets(client, "list", nil)
	watches := breakableSecretWatches(client)
	clk := clocktesting.NewFakeClock(testNow)
	a := attackAuthority(t, client, clk, "attack-outage", nil)
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	waitBlocked(t, clk)
	bundle := a.CurrentCABundleContent()

	outage := apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
	gets.fail(outage)
	lists.fail(outage)
	watches.fail(outage)
	for range 120 {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
		require.NoError(t, handshakeWith(t, a, bundle, clk.Now), "at %s, %s into the outage", clk.Now(), clk.Since(testNow))
	}
	// The Authority reads from its watch until the watch reports the
	// failure, which the informer does on the real clock, possibly after
	// the steps above: the outage must be reported once it has.
	waitFor(t, "the outage reported", func() bool {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
		return a.LastError() != nil
	})
	require.NoError(t, handshakeWith(t, a, bundle, clk.Now), "at %s, with the outage reported", clk.Now())

	gets.fail(nil)
	lists.fail(nil)
	watches.fail(nil)
	waitFor(t, "recovery", func() bool {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
		return a.LastError() == nil
	})
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, handshakeWith(t, a, s.Data[dynamiccert.SecretCAKey], clk.Now))
	assert.Zero(t, a.Status().UnsafeRotations)
}

// TestAttackGarbageSecretKeepsLeafFresh: a second writer puts garbage into
// the Secret. Where the replica holds what the garbage replaced (the signing
// CA and its key, the bundle it publishes) it writes that back (issue 27
// §3); where it does not (a successor it never saw), it must not overwrite
// content it cannot read, and reports it. Either way the replica still
// holds a valid CA, so its own leaf keeps being renewed meanwhile.
func TestAttackGarbageSecretKeepsLeafFresh(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mutate   func(data map[string][]byte, annotations map[string]string)
		repaired bool
	}{
		{"garbage tls.crt", func(d map[string][]byte, _ map[string]string) { d["tls.crt"] = []byte("not a certificate") }, true},
		{"garbage ca.crt", func(d map[string][]byte, _ map[string]string) {
			d[dynamiccert.SecretCAKey] = []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
		}, true},
		{"next.crt without next.key", func(d map[string][]byte, _ map[string]string) { d[NextCertKey] = d["tls.crt"] }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			clk := clocktesting.NewFakeClock(testNow)
			a := attackAuthority(t, client, clk, "attack-garbage", nil)
			runInBackground(t, a.Run)
			waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
			waitBlocked(t, clk)
			bundle := a.CurrentCABundleContent()

			secrets := client.CoreV1().Secrets("ns")
			s, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
			require.NoError(t, err)
			good := maps.Clone(s.Data)
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			tc.mutate(s.Data, s.Annotations)
			_, err = secrets.Update(context.Background(), s, metav1.UpdateOptions{})
			require.NoError(t, err)
			if !tc.repaired {
				waitFor(t, "the garbage to be reported", func() bool { return a.LastError() != nil })
			}
			for range 120 {
				clk.Step(time.Minute)
				waitBlocked(t, clk)
				require.NoError(t, handshakeWith(t, a, bundle, clk.Now), "%s after the garbage was written", clk.Since(testNow))
			}
			after, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
			require.NoError(t, err)
			if tc.repaired {
				require.NoError(t, a.LastError())
				assert.Equal(t, good, after.Data, "the garbage is replaced by what the replica holds")
				return
			}
			require.Error(t, a.LastError())
			assert.Equal(t, s.Data, after.Data, "content it cannot read and cannot repair is never overwritten")
		})
	}
}

// TestAttackStoreFailureIsVisibleBeforeTheOutage: the CA Secret holds
// garbage a second writer left there that this replica cannot repair (a
// successor it never saw), so no successor can be published. The leaf
// keeps being renewed from the CA in memory, but that CA is heading for
// its expiry, and with it the serving certificate. Status().Broken names
// the cause at once (issue 27 §3); the ca-rotation check turns red while
// there is still time to act (within the leaf renew-before of the CA's
// end), not at the outage, and not before: every replica reads the same
// Secret, and failing them all at once would empty the Service while each
// still serves a valid leaf.
func TestAttackStoreFailureIsVisibleBeforeTheOutage(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a := attackAuthority(t, client, clk, "attack-visible", nil)
	check := RotationCheck(a)
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	waitBlocked(t, clk)
	signing := a.Status().Signing
	editSecret(t, client, func(s *corev1.Secret) { s.Data[NextCertKey] = []byte("garbage") })
	waitFor(t, "the garbage to be reported", func() bool { return a.LastError() != nil })

	for clk.Now().Before(signing.NotAfter.Add(-a.cfg.RenewBefore)) {
		require.NoError(t, check.Check(nil), "at %s", clk.Now())
		assert.Contains(t, a.Status().Broken, NextCertKey, "Status names the cause at once")
		clk.Step(10 * time.Minute)
		waitBlocked(t, clk)
	}
	err := check.Check(nil)
	require.Error(t, err, "the CA expires at %s and nothing can replace it, yet ca-rotation is healthy", signing.NotAfter)
	assert.Contains(t, err.Error(), NextCertKey, "the check names the cause")
	assert.True(t, a.Status().Stalled)
}

// breakableWatches serves Secret watches from the fake's tracker; fail
// closes the open ones and refuses new ones with err (nil: accept again).
type breakableWatches struct {
	mu   sync.Mutex
	err  error
	open []watch.Interface
}

func breakableSecretWatches(client *fake.Clientset) *breakableWatches {
	b := &breakableWatches{}
	client.PrependWatchReactor("secrets", func(action clienttesting.Action) (bool, watch.Interface, error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.err != nil {
			return true, nil, b.err
		}
		var opts metav1.ListOptions
		if wa, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		if err == nil {
			b.open = append(b.open, w)
		}
		return true, w, err
	})
	return b
}

func (b *breakableWatches) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.err = err
	if err != nil {
		for _, w := range b.open {
			w.Stop()
		}
		b.open = nil
	}
}
