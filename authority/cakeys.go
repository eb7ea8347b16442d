package authority

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// CAKeySource keeps an Authority's CA private keys outside its CA Secret,
// e.g. in a hardware security module (package
// github.com/evercert/evercert/pkcs11 is a PKCS#11 one). The Secret then
// holds the CA certificates and, in KeyRefKey and
// NextKeyRefKey, a reference to each key, never the key itself.
// Replicas sharing the key store find a key by its reference.
//
// Implementations must be safe for concurrent use. They need not bound
// their calls in time: the Authority does (Config.CAKeyTimeout).
// Closing the store is the implementation's business.
//
// FIPS: a key in a module signs with the module's own, separately
// validated implementation (its FIPS 140 certificate and approved mode),
// not Go's FIPS 140-3 module, so GODEBUG=fips140=only does not cover the
// CA signatures; the checks of key types on certificates still apply.
type CAKeySource interface {
	// Name names the key store (e.g. its token or slot) in errors, logs
	// and Events. It must not contain secrets.
	Name() string
	// NewKey makes a new CA key of type kt and returns it with a reference
	// that finds it again on every replica sharing the store. The
	// reference is stored in the CA Secret: it must be printable and must
	// not be a secret.
	NewKey(ctx context.Context, kt dynamiccert.KeyType) (key crypto.Signer, ref string, err error)
	// FindKey returns the key NewKey returned ref for. A key that is gone
	// is an error, naming the store and the reference.
	FindKey(ctx context.Context, ref string) (crypto.Signer, error)
}

// CAKeyDeleter is implemented by a CAKeySource that can delete keys. The
// Authority then deletes each key it made for a CA that never reached the
// Secret because another replica wrote first (a Conflict or AlreadyExists,
// so the write certainly did not commit): at R replicas reaching a
// rotation at once, up to R-1 such keys per CA made, which would otherwise
// fill a key store whose objects are few (some HSMs hold a few hundred).
// A key whose write failed otherwise (a timeout: the write may have
// committed) is kept, and so are the keys of CAs that left the Secret
// (another replica may still sign with one until it reads the Secret);
// remove those with the store's own tools.
type CAKeyDeleter interface {
	// DeleteKey deletes the key ref names. A key that is already gone is
	// not an error.
	DeleteKey(ctx context.Context, ref string) error
}

// DefaultCAKeyTimeout bounds every call to a CAKeySource and every
// signature with one of its keys (Config.CAKeyTimeout).
const DefaultCAKeyTimeout = 10 * time.Second

// caKeys is an Authority's CAKeySource, with every call and signature
// bounded by timeout on clock, and the keys found by reference cached.
type caKeys struct {
	src     CAKeySource
	timeout time.Duration
	clock   clock.Clock

	// stuck counts the calls and signatures abandoned at the timeout that
	// have not returned yet: while one has not, the store is taken for
	// hung and every new call fails at once, so retries do not pile up
	// goroutines on it.
	stuck atomic.Int32

	mu    sync.Mutex
	found map[string]crypto.Signer // by reference, bounded
	// made are the references of the keys made since the last settle:
	// during one read-decide-write of the Secret.
	made []string
}

func newCAKeys(src CAKeySource, timeout time.Duration, clk clock.Clock) *caKeys {
	if src == nil {
		return nil
	}
	return &caKeys{src: src, timeout: timeout, clock: clk, found: map[string]crypto.Signer{}}
}

// newKey makes a CA key of type kt in the store.
func (k *caKeys) newKey(kt pki.KeyType) (crypto.Signer, string, error) {
	var ref string
	key, err := bounded(k, "making a CA key", func(ctx context.Context) (crypto.Signer, error) {
		key, r, err := k.src.NewKey(ctx, dynamiccert.KeyType(kt))
		ref = r
		return key, err
	})
	if err != nil {
		return nil, "", err
	}
	if ref == "" {
		return nil, "", fmt.Errorf("CA key source %s: making a CA key: empty key reference", k.src.Name())
	}
	s := k.wrap(key, ref)
	k.mu.Lock()
	k.found[ref] = s
	k.made = append(k.made, ref)
	k.mu.Unlock()
	return s, ref, nil
}

// settle ends one read-decide-write of the Secret. written reports whether
// the Secret may now reference the keys made during it (a write was sent
// and did not fail with a Conflict or AlreadyExists); when it may not, they
// are deleted from a store that can (CAKeyDeleter). A failed delete is
// logged: the key is left behind, nothing else breaks.
func (k *caKeys) settle(ctx context.Context, written bool) {
	if k == nil {
		return
	}
	k.mu.Lock()
	made := k.made
	k.made = nil
	if !written {
		for _, ref := range made {
			delete(k.found, ref)
		}
	}
	k.mu.Unlock()
	deleter, ok := k.src.(CAKeyDeleter)
	if written || !ok {
		return
	}
	for _, ref := range made {
		_, err := bounded(k, fmt.Sprintf("deleting CA key %q", ref), func(ctx context.Context) (struct{}, error) {
			return struct{}{}, deleter.DeleteKey(ctx, ref)
		})
		if err != nil {
			klog.FromContext(ctx).Info("Could not delete a CA key made for a Secret write that another replica won; it stays in the key store", "keyStore", k.src.Name(), "key", ref, "err", err)
		}
	}
}

// find returns the key ref names, from the cache or the store.
func (k *caKeys) find(ref string) (crypto.Signer, error) {
	k.mu.Lock()
	s, ok := k.found[ref]
	k.mu.Unlock()
	if ok {
		return s, nil
	}
	key, err := bounded(k, fmt.Sprintf("finding CA key %q", ref), func(ctx context.Context) (crypto.Signer, error) {
		return k.src.FindKey(ctx, ref)
	})
	if err != nil {
		return nil, err
	}
	s = k.wrap(key, ref)
	k.mu.Lock()
	k.found[ref] = s
	k.mu.Unlock()
	return s, nil
}

// keep forgets the cached keys whose reference is not in refs: CAs that
// left the Secret.
func (k *caKeys) keep(refs ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for ref := range k.found {
		keep := false
		for _, r := range refs {
			keep = keep || r == ref
		}
		if !keep {
			delete(k.found, ref)
		}
	}
}

// forget drops ref from the cache after a signature failed, so the next
// attempt looks the key up again and says whether it is still there.
func (k *caKeys) forget(ref string) {
	k.mu.Lock()
	delete(k.found, ref)
	k.mu.Unlock()
}

func (k *caKeys) wrap(key crypto.Signer, ref string) crypto.Signer {
	if key == nil {
		return nil
	}
	return &boundedSigner{keys: k, key: key, ref: ref}
}

// errCAKeyTimeout is wrapped by the error of a key store call or signature
// that did not return within the timeout.
var errCAKeyTimeout = errors.New("key store did not answer")

// bounded runs fn, waiting at most k.timeout on k.clock. An fn that hangs
// (an HSM that stopped answering) keeps its goroutine until it returns,
// and until then every bounded call fails at once: at most one goroutine
// per Authority waits on a hung store. The context passed to fn is
// cancelled at the timeout, for stores that honour it.
func bounded[T any](k *caKeys, what string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if n := k.stuck.Load(); n > 0 {
		return zero, fmt.Errorf("CA key source %s: %s: %w: an earlier call has not returned after %v", k.src.Name(), what, errCAKeyTimeout, k.timeout)
	}
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		v   T
		err error
	}
	const running, returned, abandoned = 0, 1, 2
	var state atomic.Int32
	done := make(chan result, 1) // the goroutine never blocks on it
	go func() {
		v, err := fn(ctx)
		if !state.CompareAndSwap(running, returned) {
			k.stuck.Add(-1) // abandoned at the timeout, and counted then
		}
		done <- result{v, err}
	}()
	t := k.clock.NewTimer(k.timeout)
	defer t.Stop()
	var r result
	select {
	case r = <-done:
	case <-t.C():
		if state.CompareAndSwap(running, abandoned) {
			k.stuck.Add(1)
			cancel()
			return zero, fmt.Errorf("CA key source %s: %s: %w within %v", k.src.Name(), what, errCAKeyTimeout, k.timeout)
		}
		r = <-done // it returned just now
	}
	cancel()
	if r.err != nil {
		return zero, fmt.Errorf("CA key source %s: %s: %w", k.src.Name(), what, r.err)
	}
	return r.v, nil
}

// boundedSigner signs with a key of a CAKeySource, bounded in time (see
// bounded). Signatures run concurrently (podcert's Signer and the leaf
// renewals share the CA key).
type boundedSigner struct {
	keys *caKeys
	key  crypto.Signer
	ref  string
}

func (s *boundedSigner) Public() crypto.PublicKey { return s.key.Public() }

func (s *boundedSigner) Sign(rand io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := bounded(s.keys, fmt.Sprintf("signing with CA key %q", s.ref), func(context.Context) ([]byte, error) {
		return s.key.Sign(rand, digest, opts)
	})
	if err != nil {
		// The next attempt looks the key up again and says whether it is
		// still there.
		s.keys.forget(s.ref)
	}
	return sig, err
}

// resolveKeys finds the keys of the CAs in st that the Secret holds only by
// reference, and refuses a reference this Authority cannot follow. secret
// names the Secret in errors.
func (k *caKeys) resolveKeys(st *caSet) error {
	for _, c := range []struct {
		ca  *pki.Issued
		key string
	}{{st.signing, KeyRefKey}, {st.next, NextKeyRefKey}} {
		if c.ca == nil || c.ca.KeyRef == "" || c.ca.Key != nil {
			continue
		}
		if k == nil {
			return fmt.Errorf("%s holds a reference to a CA key in a key store (%q), but this Authority has no CAKeys configured: configure the key store that holds it", c.key, c.ca.KeyRef)
		}
		key, err := k.find(c.ca.KeyRef)
		if err != nil {
			return fmt.Errorf("%s: %w", c.key, err)
		}
		if !publicKeysEqual(key.Public(), c.ca.Cert.PublicKey) {
			return fmt.Errorf("%s: CA key %q in key store %s does not match the CA certificate %q", c.key, c.ca.KeyRef, k.src.Name(), c.ca.Cert.Subject.CommonName)
		}
		c.ca.Key = key
	}
	if k != nil {
		var refs []string
		for _, ca := range []*pki.Issued{st.signing, st.next} {
			if ca != nil && ca.KeyRef != "" {
				refs = append(refs, ca.KeyRef)
			}
		}
		k.keep(refs...)
	}
	return nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}
