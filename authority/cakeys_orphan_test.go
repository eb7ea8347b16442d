package authority

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
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
