package authority

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// memKeys is an in-memory CAKeySource that remembers every key it made.
type memKeys struct {
	mu   sync.Mutex
	n    int
	keys map[string]crypto.Signer
}

func (m *memKeys) Name() string { return "memory" }

func (m *memKeys) NewKey(context.Context, dynamiccert.KeyType) (crypto.Signer, string, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ref := fmt.Sprintf("key-%d", m.n)
	m.n++
	m.keys[ref] = k
	return k, ref, nil
}

func (m *memKeys) DeleteKey(_ context.Context, ref string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.keys, ref)
	return nil
}

func (m *memKeys) FindKey(_ context.Context, ref string) (crypto.Signer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k, ok := m.keys[ref]; ok {
		return k, nil
	}
	return nil, fmt.Errorf("key %q is not in the store", ref)
}

// TestLostWriteLeavesNoKeyInTheStore: a CA whose Secret write loses to
// another replica (here: the Create finds the Secret already created, as
// when two replicas start together) never reaches the Secret; its key,
// made in a key store that can delete (CAKeyDeleter), is deleted, so lost
// races do not fill the store. Before, nothing ever deleted it.
func TestLostWriteLeavesNoKeyInTheStore(t *testing.T) {
	client := fake.NewClientset()
	var lost atomic.Bool
	client.PrependReactor("create", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		if lost.CompareAndSwap(false, true) {
			return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Resource: "secrets"}, "ca")
		}
		return false, nil, nil
	})
	store := &memKeys{keys: map[string]crypto.Signer{}}
	clk := clocktesting.NewFakeClock(testNow)
	a := attackAuthority(t, client, clk, "orphan-keys", func(c *Config) { c.CAKeys = store })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	store.mu.Lock()
	defer store.mu.Unlock()
	require.Equal(t, 2, store.n, "a key for the lost write, then one for the write that won")
	require.Len(t, store.keys, 1, "the key made for the lost write is deleted")
	for ref := range store.keys {
		require.Equal(t, ref, string(s.Data[KeyRefKey]), "key %s in the store is referenced by no CA in the Secret (made for a write that lost)", ref)
	}
}

// failingSigner is a key of a key store that stops answering.
type failingSigner struct {
	crypto.Signer
	down *atomic.Bool
}

func (f failingSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if f.down.Load() {
		return nil, errors.New("key store did not answer")
	}
	return f.Signer.Sign(r, digest, opts)
}

// downKeys is a memKeys whose keys fail to sign while down is set.
type downKeys struct {
	*memKeys
	down atomic.Bool
}

func (d *downKeys) NewKey(ctx context.Context, kt dynamiccert.KeyType) (crypto.Signer, string, error) {
	k, ref, err := d.memKeys.NewKey(ctx, kt)
	return failingSigner{k, &d.down}, ref, err
}

func (d *downKeys) FindKey(ctx context.Context, ref string) (crypto.Signer, error) {
	k, err := d.memKeys.FindKey(ctx, ref)
	if err != nil {
		return nil, err
	}
	return failingSigner{k, &d.down}, nil
}

// TestPromotionWhileTheKeyStoreFailsIsAdopted: the successor CA is promoted
// while the CA key store cannot sign (an HSM that hangs), so this replica
// cannot sign its leaf with it. It must still take the successor as the CA
// in force: its bundle, its Status (the simulator found a promotion counted
// unsafe that Status did not show) and its Lease follow the Secret, the
// failure is reported, and the leaf follows once the store answers.
// Before, the failed leaf left everything else as it was before the check.
func TestPromotionWhileTheKeyStoreFailsIsAdopted(t *testing.T) {
	client := fake.NewClientset()
	keys := &downKeys{memKeys: &memKeys{keys: map[string]crypto.Signer{}}}
	clk := clocktesting.NewFakeClock(testNow)
	a := attackAuthority(t, client, clk, "hsm-down", func(c *Config) { c.CAKeys = keys })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
	first := a.Status().Signing.Fingerprint
	for a.Status().Successor == nil {
		clk.Step(10 * time.Minute)
		waitFor(t, "the loop asleep", func() bool { return clk.Waiters() >= 1 })
	}
	successor := a.Status().Successor.Fingerprint
	keys.down.Store(true)
	for a.Status().Signing.Fingerprint == first {
		require.True(t, clk.Now().Before(a.Status().Signing.NotAfter.Add(time.Hour)), "the successor never took over in Status (it names %s)", a.Status().Signing.Fingerprint)
		clk.Step(10 * time.Minute)
		waitFor(t, "the loop asleep", func() bool { return clk.Waiters() >= 1 })
	}
	require.Equal(t, successor, a.Status().Signing.Fingerprint)
	require.ErrorContains(t, a.Status().LastError, "key store did not answer", "the failed leaf is reported")
	cas, err := pki.ParseCABundle(a.CurrentCABundleContent())
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(cas, func(c *x509.Certificate) bool { return Fingerprint(c) == successor }), "the bundle follows")

	keys.down.Store(false)
	for a.Leaf() == nil || !bytes.Equal(a.Leaf().RawIssuer, caSubject(t, a, successor)) {
		clk.Step(time.Minute)
		waitFor(t, "the loop asleep", func() bool { return clk.Waiters() >= 1 })
	}
}

// caSubject returns the raw subject of the CA of a's bundle with fingerprint fp.
func caSubject(t *testing.T, a *Authority, fp string) []byte {
	t.Helper()
	cas, err := pki.ParseCABundle(a.CurrentCABundleContent())
	require.NoError(t, err)
	for _, c := range cas {
		if Fingerprint(c) == fp {
			return c.RawSubject
		}
	}
	t.Fatalf("CA %s is not in the bundle", fp)
	return nil
}
