//go:build soak

package soak

import (
	"context"
	"crypto"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
)

// hsmTimeout is the replicas' CAKeyTimeout in the soak's key-store
// scenarios, on the simulated clock.
const hsmTimeout = time.Minute

// softKeyStore is the soak's authority.CAKeySource: the CA keys every
// replica shares, in memory, as an HSM keeps them. While hung, every call
// and signature blocks until it answers again: an HSM that stops
// answering. The PKCS#11 implementation itself is tested against SoftHSM2
// in the pkcs11 module; this one stays pure Go, like the rest of the soak.
type softKeyStore struct {
	mu   sync.Mutex
	keys map[string]crypto.Signer
	seq  int
	// answering is closed while the store answers; hang replaces it.
	answering chan struct{}
	// blocked counts the calls that waited on a hung store; waiting those
	// waiting now.
	blocked, waiting atomic.Int64
}

func newSoftKeyStore() *softKeyStore {
	s := &softKeyStore{keys: map[string]crypto.Signer{}, answering: make(chan struct{})}
	close(s.answering)
	return s
}

func (s *softKeyStore) Name() string { return "soak key store" }

func (s *softKeyStore) hang() {
	s.mu.Lock()
	s.answering = make(chan struct{})
	s.mu.Unlock()
}

// answer makes the store answer again, and every call waiting on it
// return; answering twice is fine (world.close does it).
func (s *softKeyStore) answer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.answering:
	default:
		close(s.answering)
	}
}

// wait blocks while the store is hung.
func (s *softKeyStore) wait() {
	s.mu.Lock()
	c := s.answering
	s.mu.Unlock()
	select {
	case <-c:
	default:
		s.blocked.Add(1)
		s.waiting.Add(1)
		<-c
		s.waiting.Add(-1)
	}
}

func (s *softKeyStore) NewKey(_ context.Context, kt dynamiccert.KeyType) (crypto.Signer, string, error) {
	s.wait()
	key, err := pki.GenerateKey(pki.KeyType(kt))
	if err != nil {
		return nil, "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	ref := fmt.Sprintf("soak-ca-%d", s.seq)
	s.keys[ref] = key
	return softKey{key, s}, ref, nil
}

func (s *softKeyStore) FindKey(_ context.Context, ref string) (crypto.Signer, error) {
	s.wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	key, ok := s.keys[ref]
	if !ok {
		return nil, fmt.Errorf("key %q is not in the store", ref)
	}
	return softKey{key, s}, nil
}

type softKey struct {
	crypto.Signer
	s *softKeyStore
}

func (k softKey) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	k.s.wait()
	return k.Signer.Sign(r, digest, opts)
}

// hsmHangCycle stops the key store from answering from before the
// successor's publication until after every replica's leaf came due (a
// day, less than a leaf's renew-before, so leaves stay valid): publication
// and leaf renewals wait, each replica's checks time out, are counted and
// back off, and every client keeps completing handshakes with the last
// good leaves. Then the store answers again and the rotation completes.
func hsmHangCycle(w *world, _ int) {
	w.runTo(w.publishAt().Add(-time.Hour))
	before := map[string]float64{}
	for _, p := range w.live() {
		before[p.auth.Name()] = certmetricstest.LoadErrors(w.t, p.auth.Name())
	}
	blocked := w.keys.blocked.Load()
	w.keys.hang()
	w.runFor(w.p.leafRenew - 2*time.Hour)
	assert.Greater(w.t, w.keys.blocked.Load(), blocked, "nothing asked the hung key store")
	// At most one call per replica waits on the hung store: retries fail
	// at once instead of piling up goroutines.
	assert.LessOrEqual(w.t, w.keys.waiting.Load(), int64(len(w.live())), "calls waiting on the hung key store")
	counted := false
	for _, p := range w.live() {
		counted = counted || certmetricstest.LoadErrors(w.t, p.auth.Name()) > before[p.auth.Name()]
	}
	assert.True(w.t, counted, "no replica counted the key store's timeout in evercert_certificate_load_errors_total")
	w.keys.answer()
	w.advance(time.Minute) // the backoffs end
	w.toPublished()
	w.toPromoted()
}
