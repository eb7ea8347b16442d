package dynamiccert

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
)

// memKeys is an in-memory CAKeySource that remembers every key it made.
type memKeys struct {
	mu   sync.Mutex
	keys map[string]crypto.Signer
}

func (m *memKeys) Name() string { return "memory" }

func (m *memKeys) NewKey(context.Context, KeyType) (crypto.Signer, string, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ref := fmt.Sprintf("key-%d", len(m.keys))
	m.keys[ref] = k
	return k, ref, nil
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
// when two replicas start together) never reaches the Secret; its key in
// the key store is referenced by nothing and nothing ever deletes it.
//
// Reproduces a defect found in review and NOT fixed here (CAKeySource has
// no way to delete a key; see the review report). Remove the Skip to
// reproduce.
func TestLostWriteLeavesNoKeyInTheStore(t *testing.T) {
	t.Skip("review finding, not fixed: CA keys made for a lost write (and of CAs that left the Secret) stay in the key store forever")
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
	a := attackAuthority(t, client, clk, "orphan-keys", func(c *AuthorityConfig) { c.CAKeys = store })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	store.mu.Lock()
	defer store.mu.Unlock()
	for ref := range store.keys {
		require.Equal(t, ref, string(s.Data[AuthorityKeyRefKey]), "key %s in the store is referenced by no CA in the Secret (made for a write that lost)", ref)
	}
}
