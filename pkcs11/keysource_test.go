package pkcs11_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
)

func TestKeySourceMakesAndFindsKeys(t *testing.T) {
	label, pin := newToken(t)
	ks := newKeySource(t, label, pin)
	ctx := context.Background()
	key, ref, err := ks.NewKey(ctx, dynamiccert.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, "evercert-ca-") {
		t.Fatalf("reference %q", ref)
	}
	// A second source on the same token, as another replica has.
	other := newKeySource(t, label, pin)
	found, err := other.FindKey(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte("evercert"))
	sig, err := found.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(key.Public().(*ecdsa.PublicKey), digest[:], sig) {
		t.Fatal("the key found by reference is not the key made")
	}
	if _, err := other.FindKey(ctx, "evercert-ca-missing"); err == nil || !strings.Contains(err.Error(), `"evercert-ca-missing" is not in the token`) {
		t.Fatalf("missing key: %v", err)
	}
	// Deleting (authority.CAKeyDeleter, for keys made for a lost Secret
	// write): gone for every source on the token; deleting again is fine.
	var _ authority.CAKeyDeleter = ks
	if err := ks.DeleteKey(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := newKeySource(t, label, pin).FindKey(ctx, ref); err == nil || !strings.Contains(err.Error(), "is not in the token") {
		t.Fatalf("deleted key: %v", err)
	}
	if err := ks.DeleteKey(ctx, ref); err != nil {
		t.Fatalf("deleting a key that is gone: %v", err)
	}
}
