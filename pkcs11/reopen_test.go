package pkcs11_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/pkcs11"
)

// tokenPath returns the directory of the token labelled label under
// tokenDir: SoftHSM2 keeps a token in a directory of its own, with the
// label in its token.object.
func tokenPath(t testing.TB, label string) string {
	t.Helper()
	dirs, err := os.ReadDir(tokenDir)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(tokenDir, d.Name(), "token.object"))
		if err == nil && bytes.Contains(b, []byte(label)) {
			found = append(found, filepath.Join(tokenDir, d.Name()))
		}
	}
	if len(found) != 1 {
		t.Fatalf("token %q is in %d directories of %s: %v", label, len(found), tokenDir, found)
	}
	return found[0]
}

// newKeySourceClock is newKeySource with the backoff of its reopenings on
// clk.
func newKeySourceClock(t testing.TB, label, pinFile string, clk clock.Clock) *pkcs11.KeySource {
	t.Helper()
	ks, err := pkcs11.New(pkcs11.Config{TokenLabel: label, PINFile: pinFile, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ks.Close() })
	return ks
}

// TestAuthorityRecoversWhenTokenComesBack: the token goes away while the
// Authority runs (its directory is moved out of SoftHSM2's token
// directory, as an HSM unplugged or a volume unmounted) and comes back.
// While it is away the renewal fails naming the token and the last leaf
// keeps serving; once it is back the Authority signs again, with the key
// it had, without a restart. SoftHSM2 reads a token's state when the
// library is initialized and never again once a read failed: the sessions
// opened before the token left keep answering "not in the token" after it
// returned, until the library is finalized and initialized again.
func TestAuthorityRecoversWhenTokenComesBack(t *testing.T) {
	label, pin := newToken(t)
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a := newAuthority(t, client, clk, "hsm-comes-back", "replica-1", newKeySourceClock(t, label, pin, clk))
	run(t, a)
	waitFor(t, "the first leaf", nil, func() bool { return a.Leaf() != nil })
	s := getSecret(t, client)
	ca := signingCA(t, s)
	addr := serve(t, a)
	first := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk)

	dir := tokenPath(t, label)
	away := filepath.Join(t.TempDir(), "away") // outside the token directory
	if err := os.Rename(dir, away); err != nil {
		t.Fatal(err)
	}
	returned := false
	defer func() {
		if !returned {
			_ = os.Rename(away, dir)
		}
	}()
	// The leaf is due: signing it needs the token.
	clk.SetTime(first.NotAfter.Add(-a.Config().RenewBefore).Add(time.Second))
	waitFor(t, "the failed renewal", nil, func() bool { return a.LastError() != nil })
	if err := a.LastError().Error(); !strings.Contains(err, `pkcs11 token "`+label+`"`) {
		t.Errorf("error %q does not name the token", err)
	}
	// Retries, on the backoff timer, fail while the token is away.
	for range 3 {
		clk.Step(backoff.DefaultCap)
		time.Sleep(50 * time.Millisecond)
	}
	if a.LastError() == nil {
		t.Fatal("a check succeeded while the token was away")
	}
	if got := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk); !got.Equal(first) {
		t.Fatal("the last good leaf is not served any more")
	}

	if err := os.Rename(away, dir); err != nil {
		t.Fatal(err)
	}
	returned = true
	defer func() {
		if t.Failed() {
			t.Logf("status %+v", a.Status())
		}
	}()
	waitFor(t, "a new leaf once the token is back", func() { clk.Step(backoff.DefaultCap) }, func() bool {
		l := a.Leaf()
		return l != nil && !l.Equal(first) && a.Status().LastError == nil
	})
	leaf := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk)
	if leaf.Equal(first) {
		t.Fatal("still serving the old leaf")
	}
	if err := leaf.CheckSignatureFrom(ca); err != nil {
		t.Fatalf("the new leaf is not signed by the CA whose key is in the token: %v", err)
	}
	if st := a.Status(); st.Stalled || st.LastError != nil {
		t.Fatalf("status after the token came back: %+v", st)
	}
}

// TestKeySourceReopenKeepsSignersWorking: keys found before the token is
// reopened (here by a lookup of an absent key, which reopens it before
// calling the key absent) keep signing, concurrently, while and after it
// is reopened; no signature fails.
func TestKeySourceReopenKeepsSignersWorking(t *testing.T) {
	label, pin := newToken(t)
	clk := clocktesting.NewFakeClock(testNow)
	ks := newKeySourceClock(t, label, pin, clk)
	ctx := context.Background()
	key, ref, err := ks.NewKey(ctx, dynamiccert.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	found, err := newKeySourceClock(t, label, pin, clk).FindKey(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	pub := key.Public().(*ecdsa.PublicKey)
	digest := sha256.Sum256([]byte("evercert"))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 8 {
		signer := []crypto.Signer{key, found}[i%2]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				sig, err := signer.Sign(rand.Reader, digest[:], crypto.SHA256)
				if err == nil && !ecdsa.VerifyASN1(pub, digest[:], sig) {
					err = os.ErrInvalid
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for range 5 {
		clk.Step(backoff.DefaultCap * 2) // past the backoff: every lookup reopens
		if _, err := ks.FindKey(ctx, "evercert-ca-absent"); err == nil || !strings.Contains(err.Error(), `"evercert-ca-absent" is not in the token`) {
			t.Errorf("absent key: %v", err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a signature failed while the token was reopened: %v", err)
	}
}
