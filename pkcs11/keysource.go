package pkcs11

import (
	"context"
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThalesGroup/crypto11"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
)

// DefaultModule is the PKCS#11 library of Debian's softhsm2 package.
const DefaultModule = "/usr/lib/softhsm/libsofthsm2.so"

// DefaultKeyLabelPrefix starts the label of every key KeySource makes.
const DefaultKeyLabelPrefix = "evercert-ca"

// Config selects a token and how keys are named in it.
type Config struct {
	// Module is the path of the PKCS#11 library. Default DefaultModule.
	Module string
	// TokenLabel selects the token by its label, Slot by its slot number:
	// exactly one is required.
	TokenLabel string
	Slot       *int
	// PINFile is a file holding the user PIN; surrounding white space is
	// trimmed. It is read at every login, so a rotated PIN takes effect at
	// the next one, and the PIN is never logged. Required.
	PINFile string
	// KeyLabelPrefix starts the CKA_LABEL of every key made here, followed
	// by "-" and 16 random hex digits (also its CKA_ID). Default
	// DefaultKeyLabelPrefix.
	KeyLabelPrefix string
	// Clock times the backoff between reopenings of the token (see
	// KeySource). Default the real clock.
	Clock clock.Clock
}

// KeySource makes and finds CA keys in a PKCS#11 token. It opens the token
// at its first use, not in New, so that a token that is missing or locked
// at start is an error of the Authority's checks, retried with backoff,
// and not of the process.
//
// A token that went away and came back, or an object another process
// wrote while this one read the token, can stay invisible to the sessions
// opened before: SoftHSM2 reads a token's state when the library is
// initialized and, once a read failed (the token's directory gone, or a
// file read while another process rewrote it), never reads that token
// again. So before KeySource calls a key absent, and after a call failed,
// it reopens the token and tries once more: it closes every KeySource's
// session on the same library in this process (waiting for their calls
// and signatures in flight), so that the library is finalized and
// initialized afresh, and opens it again. Only a key still absent then is
// "not in the token". Reopenings back off (Config.Clock), so a missing
// token is not hammered: between them a call fails at once with the last
// error. Keys found before a reopening find themselves again at their next
// signature. Another user of the same library in the process (not a
// KeySource) keeps it initialized, and the reopening cannot refresh it.
//
// A call that hangs in the module keeps a reopening, and so every other
// call on the library in this process, waiting until it returns: the
// Authority bounds each call (authority.Config.CAKeyTimeout) and then fails
// at once while one is stuck. It is safe for concurrent use.
type KeySource struct {
	cfg  Config
	name string
	mod  *module

	mu  sync.Mutex
	ctx *crypto11.Context // nil until opened, and after a reopening
	gen uint64            // the module's generation ctx was opened in
	// failed is the error of the last failed opening, returned without
	// trying again until next.
	failed error
	// next is the earliest time of the next reopening; backoff times the
	// reopenings that did not help.
	next    time.Time
	backoff *backoff.Backoff
}

// Reopenings of the token wait this long, doubling after each that did
// not help, up to backoff.DefaultCap.
const reopenInitial = time.Second

// module is one PKCS#11 library as this process loaded it. crypto11 shares
// one initialization of a library among all its Contexts and finalizes it
// when the last one closes, so a reopening closes the Contexts of every
// KeySource on the library at once.
type module struct {
	// rw is held for reading by every call on a Context of the library
	// (opening one, finding, making, deleting, signing) and for writing by
	// a reopening, which closes them all: a reopening waits for the calls
	// in flight, and no call starts during it.
	rw sync.RWMutex
	// gen counts the reopenings; written with rw held for writing.
	gen uint64

	mu   sync.Mutex
	open map[*KeySource]struct{} // the KeySources with a Context open
}

var (
	modulesMu sync.Mutex
	modules   = map[string]*module{} // by library path, as crypto11 shares them
)

func moduleFor(path string) *module {
	modulesMu.Lock()
	defer modulesMu.Unlock()
	m := modules[path]
	if m == nil {
		m = &module{open: map[*KeySource]struct{}{}}
		modules[path] = m
	}
	return m
}

var _ authority.CAKeySource = &KeySource{}

// New validates cfg; it does not open the token.
func New(cfg Config) (*KeySource, error) {
	if cfg.Module == "" {
		cfg.Module = DefaultModule
	}
	if cfg.KeyLabelPrefix == "" {
		cfg.KeyLabelPrefix = DefaultKeyLabelPrefix
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if (cfg.TokenLabel == "") == (cfg.Slot == nil) {
		return nil, errors.New("pkcs11: exactly one of TokenLabel and Slot is required")
	}
	if cfg.PINFile == "" {
		return nil, errors.New("pkcs11: PINFile is required")
	}
	name := fmt.Sprintf("pkcs11 token %q", cfg.TokenLabel)
	if cfg.Slot != nil {
		name = "pkcs11 slot " + strconv.Itoa(*cfg.Slot)
	}
	return &KeySource{
		cfg: cfg, name: name + " (module " + cfg.Module + ")", mod: moduleFor(cfg.Module),
		backoff: backoff.New(reopenInitial, backoff.DefaultCap),
	}, nil
}

// Name names the token and the module, e.g.
// `pkcs11 token "evercert" (module /usr/lib/softhsm/libsofthsm2.so)`.
func (k *KeySource) Name() string { return k.name }

// acquire returns the open token, opening it if needed, with k.mod.rw held
// for reading; the caller releases it. On error rw is not held, and gen is
// the module's generation the error belongs to.
func (k *KeySource) acquire() (*crypto11.Context, uint64, error) {
	k.mod.rw.RLock()
	gen := k.mod.gen
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ctx != nil {
		return k.ctx, k.gen, nil
	}
	if k.failed != nil && k.cfg.Clock.Now().Before(k.next) {
		k.mod.rw.RUnlock()
		return nil, gen, k.failed
	}
	ctx, err := k.configure()
	if err != nil {
		k.failed = err
		k.mod.rw.RUnlock()
		return nil, gen, err
	}
	k.ctx, k.gen, k.failed = ctx, gen, nil
	k.mod.mu.Lock()
	k.mod.open[k] = struct{}{}
	k.mod.mu.Unlock()
	return ctx, gen, nil
}

func (k *KeySource) configure() (*crypto11.Context, error) {
	pin, err := os.ReadFile(k.cfg.PINFile)
	if err != nil {
		return nil, fmt.Errorf("reading the PIN file: %w", err)
	}
	ctx, err := crypto11.Configure(&crypto11.Config{
		Path: k.cfg.Module, TokenLabel: k.cfg.TokenLabel, SlotNumber: k.cfg.Slot,
		Pin: strings.TrimSpace(string(pin)),
	})
	if err != nil {
		return nil, fmt.Errorf("opening the token: %w", err)
	}
	return ctx, nil
}

// reopen closes every KeySource's Context on the module, unless a
// reopening already happened since generation gen, so that the next call
// opens the token on a freshly initialized library. It reports false,
// doing nothing, while k's backoff forbids it.
func (k *KeySource) reopen(gen uint64) bool {
	k.mu.Lock()
	now := k.cfg.Clock.Now()
	if now.Before(k.next) {
		k.mu.Unlock()
		return false
	}
	k.next = now.Add(k.backoff.Next(nil))
	k.failed = nil
	k.mu.Unlock()

	k.mod.rw.Lock()
	defer k.mod.rw.Unlock()
	if k.mod.gen != gen {
		return true // another KeySource reopened it meanwhile
	}
	k.mod.gen++
	k.mod.mu.Lock()
	open := k.mod.open
	k.mod.open = map[*KeySource]struct{}{}
	k.mod.mu.Unlock()
	for src := range open {
		src.mu.Lock()
		ctx := src.ctx
		src.ctx = nil
		src.mu.Unlock()
		if ctx != nil {
			// Nothing is in flight (rw is held for writing): this returns at
			// once, and the last one finalizes the library.
			_ = ctx.Close()
		}
	}
	return true
}

// withToken runs op on the open token. When the token cannot be opened,
// op fails, or op reports that what it looked for is absent, the token is
// reopened (see KeySource) and op runs once more, unless the backoff
// forbids a reopening now or ctx is done: then the first outcome stands.
func (k *KeySource) withToken(ctx context.Context, op func(c *crypto11.Context, gen uint64) (absent bool, err error)) (bool, error) {
	for attempt := 0; ; attempt++ {
		c, gen, err := k.acquire()
		absent := false
		if err == nil {
			absent, err = op(c, gen)
			k.mod.rw.RUnlock()
			if err == nil && !absent {
				if attempt > 0 {
					// The reopening helped: the next one need not wait long.
					k.mu.Lock()
					k.backoff.Reset()
					k.mu.Unlock()
				}
				return false, nil
			}
		}
		if attempt > 0 || ctx.Err() != nil || !k.reopen(gen) {
			return absent, err
		}
	}
}

// NewKey makes a key pair of type kt in the token; the reference is its
// label. ECDSA P-256 and P-384, RSA 2048 and 3072. A failure reopens the
// token for the next call (within the backoff) but is not retried: the key
// may have been made.
func (k *KeySource) NewKey(_ context.Context, kt dynamiccert.KeyType) (crypto.Signer, string, error) {
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		return nil, "", err
	}
	label := k.cfg.KeyLabelPrefix + "-" + hex.EncodeToString(id)
	var generate func(c *crypto11.Context) (crypto11.Signer, error)
	switch kt {
	case dynamiccert.ECDSAP256, "":
		generate = func(c *crypto11.Context) (crypto11.Signer, error) {
			return c.GenerateECDSAKeyPairWithLabel(id, []byte(label), elliptic.P256())
		}
	case dynamiccert.ECDSAP384:
		generate = func(c *crypto11.Context) (crypto11.Signer, error) {
			return c.GenerateECDSAKeyPairWithLabel(id, []byte(label), elliptic.P384())
		}
	case dynamiccert.RSA2048:
		generate = func(c *crypto11.Context) (crypto11.Signer, error) {
			return c.GenerateRSAKeyPairWithLabel(id, []byte(label), 2048)
		}
	case dynamiccert.RSA3072:
		generate = func(c *crypto11.Context) (crypto11.Signer, error) {
			return c.GenerateRSAKeyPairWithLabel(id, []byte(label), 3072)
		}
	default:
		return nil, "", fmt.Errorf("key type %q is not supported", kt)
	}
	c, g, err := k.acquire()
	if err != nil {
		k.reopen(g)
		return nil, "", err
	}
	key, err := generate(c)
	k.mod.rw.RUnlock()
	if err != nil {
		k.reopen(g)
		return nil, "", fmt.Errorf("generating %s key %q: %w", kt, label, err)
	}
	return &signer{k: k, ref: label, pub: key.Public(), key: key, gen: g}, label, nil
}

// find returns the one key pair labelled ref in c, or nil if there is none.
func find(c *crypto11.Context, ref string) (crypto11.Signer, error) {
	// FindKeyPairs, not FindKeyPair: it tells a key that is absent from a
	// token that failed to answer.
	keys, err := c.FindKeyPairs(nil, []byte(ref))
	if err != nil {
		return nil, fmt.Errorf("finding key %q: %w", ref, err)
	}
	switch len(keys) {
	case 0:
		return nil, nil
	case 1:
		return keys[0], nil
	default:
		return nil, fmt.Errorf("%d keys are labelled %q in the token; expected one", len(keys), ref)
	}
}

// FindKey finds the key pair labelled ref. A key absent from the open
// token is looked for again after reopening it (see KeySource).
func (k *KeySource) FindKey(ctx context.Context, ref string) (crypto.Signer, error) {
	var s *signer
	absent, err := k.withToken(ctx, func(c *crypto11.Context, gen uint64) (bool, error) {
		key, err := find(c, ref)
		if key != nil {
			s = &signer{k: k, ref: ref, pub: key.Public(), key: key, gen: gen}
		}
		return key == nil && err == nil, err
	})
	switch {
	case err != nil:
		return nil, err
	case absent:
		return nil, fmt.Errorf("key %q is not in the token", ref)
	}
	return s, nil
}

// signer is a key pair of the token. It signs with the key found in the
// Context it was found in; after a reopening it finds the key again, by
// its label, and checks that it is the same key.
type signer struct {
	k   *KeySource
	ref string
	pub crypto.PublicKey

	mu  sync.Mutex
	key crypto11.Signer
	gen uint64 // the module generation key belongs to
}

func (s *signer) Public() crypto.PublicKey { return s.pub }

// Sign signs with the key; a failure reopens the token and signs once more
// (see KeySource). Signatures run concurrently.
func (s *signer) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	var sig []byte
	absent, err := s.k.withToken(context.Background(), func(c *crypto11.Context, gen uint64) (bool, error) {
		key, err := s.in(c, gen)
		if key == nil || err != nil {
			return key == nil && err == nil, err
		}
		sig, err = key.Sign(r, digest, opts)
		return false, err
	})
	if absent {
		return nil, fmt.Errorf("key %q is not in the token any more", s.ref)
	}
	return sig, err
}

// in returns the key as found in c, of module generation gen (nil if it is
// not there), finding it again if it was found in an earlier generation.
func (s *signer) in(c *crypto11.Context, gen uint64) (crypto11.Signer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen == gen {
		return s.key, nil
	}
	key, err := find(c, s.ref)
	if key == nil || err != nil {
		return nil, err
	}
	if !publicKeysEqual(key.Public(), s.pub) {
		return nil, fmt.Errorf("key %q in the token is not the key found before the token was reopened", s.ref)
	}
	s.key, s.gen = key, gen
	return key, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

// DeleteKey deletes the key pair labelled ref (authority.CAKeyDeleter):
// the Authority deletes the keys it made for CAs whose Secret write another
// replica won. A key that is already gone (after reopening the token, see
// KeySource) is not an error.
func (k *KeySource) DeleteKey(ctx context.Context, ref string) error {
	_, err := k.withToken(ctx, func(c *crypto11.Context, _ uint64) (bool, error) {
		keys, err := c.FindKeyPairs(nil, []byte(ref))
		if err != nil {
			return false, fmt.Errorf("finding key %q to delete: %w", ref, err)
		}
		for _, key := range keys {
			if err := key.Delete(); err != nil {
				return false, fmt.Errorf("deleting key %q: %w", ref, err)
			}
		}
		return len(keys) == 0, nil
	})
	return err
}

// Close closes the token, if open, once the calls and signatures in flight
// on it return. The KeySource, and the keys found before, open it again if
// used.
func (k *KeySource) Close() error {
	// Held for reading so that a reopening does not finish (and the
	// library is not initialized again) while this Context still holds it.
	k.mod.rw.RLock()
	defer k.mod.rw.RUnlock()
	k.mu.Lock()
	ctx := k.ctx
	k.ctx = nil
	k.mu.Unlock()
	if ctx == nil {
		return nil
	}
	k.mod.mu.Lock()
	delete(k.mod.open, k)
	k.mod.mu.Unlock()
	return ctx.Close()
}
