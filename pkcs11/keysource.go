package pkcs11

import (
	"context"
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/ThalesGroup/crypto11"

	"github.com/evercert/evercert/dynamiccert"
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
}

// KeySource makes and finds CA keys in a PKCS#11 token. It opens the token
// at its first use, not in New, so that a token that is missing or locked
// at start is an error of the Authority's checks, retried with backoff,
// and not of the process; after a failure that may have lost the token
// (not a key that is simply absent) it opens it again at the next call.
// It is safe for concurrent use.
type KeySource struct {
	cfg  Config
	name string

	mu  sync.Mutex
	ctx *crypto11.Context // nil until opened, and after a failure
}

var _ dynamiccert.CAKeySource = &KeySource{}

// New validates cfg; it does not open the token.
func New(cfg Config) (*KeySource, error) {
	if cfg.Module == "" {
		cfg.Module = DefaultModule
	}
	if cfg.KeyLabelPrefix == "" {
		cfg.KeyLabelPrefix = DefaultKeyLabelPrefix
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
	return &KeySource{cfg: cfg, name: name + " (module " + cfg.Module + ")"}, nil
}

// Name names the token and the module, e.g.
// `pkcs11 token "evercert" (module /usr/lib/softhsm/libsofthsm2.so)`.
func (k *KeySource) Name() string { return k.name }

// open returns the open token, opening it if needed.
func (k *KeySource) open() (*crypto11.Context, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ctx != nil {
		return k.ctx, nil
	}
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
	k.ctx = ctx
	return ctx, nil
}

// lost drops ctx after a call on it failed, so the next call opens the
// token again (it may have been removed, re-initialized, or logged out).
// Closing waits for the signatures still running on it, in the background.
func (k *KeySource) lost(ctx *crypto11.Context) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ctx == ctx {
		k.ctx = nil
		go func() { _ = ctx.Close() }() // returns once in-flight calls do
	}
}

// NewKey makes a key pair of type kt in the token; the reference is its
// label. ECDSA P-256 and P-384, RSA 2048 and 3072.
func (k *KeySource) NewKey(_ context.Context, kt dynamiccert.KeyType) (crypto.Signer, string, error) {
	ctx, err := k.open()
	if err != nil {
		return nil, "", err
	}
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		return nil, "", err
	}
	label := k.cfg.KeyLabelPrefix + "-" + hex.EncodeToString(id)
	var key crypto.Signer
	switch kt {
	case dynamiccert.ECDSAP256, "":
		key, err = ctx.GenerateECDSAKeyPairWithLabel(id, []byte(label), elliptic.P256())
	case dynamiccert.ECDSAP384:
		key, err = ctx.GenerateECDSAKeyPairWithLabel(id, []byte(label), elliptic.P384())
	case dynamiccert.RSA2048:
		key, err = ctx.GenerateRSAKeyPairWithLabel(id, []byte(label), 2048)
	case dynamiccert.RSA3072:
		key, err = ctx.GenerateRSAKeyPairWithLabel(id, []byte(label), 3072)
	default:
		return nil, "", fmt.Errorf("key type %q is not supported", kt)
	}
	if err != nil {
		k.lost(ctx)
		return nil, "", fmt.Errorf("generating %s key %q: %w", kt, label, err)
	}
	return key, label, nil
}

// FindKey finds the key pair labelled ref.
func (k *KeySource) FindKey(_ context.Context, ref string) (crypto.Signer, error) {
	ctx, err := k.open()
	if err != nil {
		return nil, err
	}
	// FindKeyPairs, not FindKeyPair: it tells a key that is absent from a
	// token that failed to answer.
	keys, err := ctx.FindKeyPairs(nil, []byte(ref))
	if err != nil {
		k.lost(ctx)
		return nil, fmt.Errorf("finding key %q: %w", ref, err)
	}
	switch len(keys) {
	case 0:
		return nil, fmt.Errorf("key %q is not in the token", ref)
	case 1:
		return keys[0], nil
	default:
		return nil, fmt.Errorf("%d keys are labelled %q in the token; expected one", len(keys), ref)
	}
}

// DeleteKey deletes the key pair labelled ref (dynamiccert.CAKeyDeleter):
// the Authority deletes the keys it made for CAs whose Secret write another
// replica won. A key that is already gone is not an error.
func (k *KeySource) DeleteKey(_ context.Context, ref string) error {
	ctx, err := k.open()
	if err != nil {
		return err
	}
	keys, err := ctx.FindKeyPairs(nil, []byte(ref))
	if err != nil {
		k.lost(ctx)
		return fmt.Errorf("finding key %q to delete: %w", ref, err)
	}
	for _, key := range keys {
		if err := key.Delete(); err != nil {
			return fmt.Errorf("deleting key %q: %w", ref, err)
		}
	}
	return nil
}

// Close closes the token, if open; keys found before fail from then on.
// The KeySource opens it again if used.
func (k *KeySource) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ctx == nil {
		return nil
	}
	err := k.ctx.Close()
	k.ctx = nil
	return err
}
