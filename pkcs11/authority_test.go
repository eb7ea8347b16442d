package pkcs11_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThalesGroup/crypto11"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
)

var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	testLifetime    = time.Hour
	testPropagation = 10 * time.Minute
)

// newAuthority makes an Authority serving 127.0.0.1 whose CA keys come
// from keys (nil: PEM in the Secret).
//
// The key store's timeout runs on clk, which the tests step while SoftHSM
// works in real time: it is an hour here, so that only the test of an HSM
// that hangs (newAuthorityTimeout) ever reaches it.
func newAuthority(t testing.TB, client kubernetes.Interface, clk clock.WithTicker, name, replica string, keys authority.CAKeySource) *authority.Authority {
	t.Helper()
	return newAuthorityTimeout(t, client, clk, name, replica, keys, time.Hour)
}

func newAuthorityTimeout(t testing.TB, client kubernetes.Interface, clk clock.WithTicker, name, replica string, keys authority.CAKeySource, timeout time.Duration) *authority.Authority {
	t.Helper()
	a, err := authority.New(authority.Config{
		Name: name, Namespace: "ns", SecretName: "ca", Client: client,
		Hosts: []string{"127.0.0.1"}, Lifetime: testLifetime, PropagationDelay: testPropagation,
		ReplicaID: replica, CAKeys: keys, CAKeyTimeout: timeout, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// run runs a's Run loop until the test ends.
func run(t testing.TB, a *authority.Authority) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(ctx, 1) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// waitFor polls cond for up to a minute; step, when set, runs between
// polls (e.g. moving a fake clock so that timers fire).
func waitFor(t testing.TB, what string, step func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		if step != nil {
			step()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func getSecret(t testing.TB, client kubernetes.Interface) *corev1.Secret {
	t.Helper()
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// assertNoPrivateKey fails if any value of the Secret holds a PEM private
// key block.
func assertNoPrivateKey(t testing.TB, s *corev1.Secret) {
	t.Helper()
	for k, v := range s.Data {
		for rest := v; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if strings.Contains(b.Type, "PRIVATE KEY") {
				t.Fatalf("CA Secret key %s holds a %s block", k, b.Type)
			}
		}
	}
}

// signingCA returns the CA certificate in tls.crt.
func signingCA(t testing.TB, s *corev1.Secret) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if b == nil {
		t.Fatal("no tls.crt in the CA Secret")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serve serves a's leaf over TLS on 127.0.0.1 and returns the address.
func serve(t testing.TB, a *authority.Authority) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if _, _, c := a.CurrentParsedCertKeyContent(); c != nil {
				return c, nil
			}
			return nil, errors.New("no leaf yet")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = io.Copy(io.Discard, c)
			})
		}
	})
	return ln.Addr().String()
}

// handshake connects to addr trusting only bundle, at clk's time, and
// returns the leaf served.
func handshake(t testing.TB, addr string, bundle []byte, clk clock.Clock) *x509.Certificate {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("empty CA bundle")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Time: clk.Now})
	if err != nil {
		t.Fatalf("TLS handshake with %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

func assertKeyInToken(t testing.TB, ks authority.CAKeySource, ref string, ca *x509.Certificate) {
	t.Helper()
	key, err := ks.FindKey(context.Background(), ref)
	if err != nil {
		t.Fatalf("CA key %q is not in the token: %v", ref, err)
	}
	if !key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(ca.PublicKey) {
		t.Fatalf("key %q in the token is not the key of CA %q", ref, ca.Subject.CommonName)
	}
}

func TestAuthorityCAKeyInSoftHSM(t *testing.T) {
	label, pin := newToken(t)
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	ks1, ks2 := newKeySource(t, label, pin), newKeySource(t, label, pin)
	a1 := newAuthority(t, client, clk, "hsm-1", "replica-1", ks1)
	run(t, a1)
	waitFor(t, "replica-1's first leaf", nil, func() bool { return a1.Leaf() != nil })

	s := getSecret(t, client)
	assertNoPrivateKey(t, s)
	if s.Type != corev1.SecretTypeOpaque {
		t.Errorf("Secret type %q, want Opaque: kubernetes.io/tls requires tls.key", s.Type)
	}
	if _, ok := s.Data[corev1.TLSPrivateKeyKey]; ok {
		t.Error("tls.key is in the Secret")
	}
	ref := string(s.Data[authority.KeyRefKey])
	ca := signingCA(t, s)
	assertKeyInToken(t, ks2, ref, ca)
	addr1 := serve(t, a1)
	if leaf := handshake(t, addr1, s.Data[dynamiccert.SecretCAKey], clk); leaf.CheckSignatureFrom(ca) != nil {
		t.Fatal("replica-1 serves a leaf its CA did not sign")
	}

	// A second replica with its own session on the same token signs with
	// the same CA key.
	a2 := newAuthority(t, client, clk, "hsm-2", "replica-2", ks2)
	run(t, a2)
	waitFor(t, "replica-2's first leaf", nil, func() bool { return a2.Leaf() != nil })
	addr2 := serve(t, a2)
	if leaf := handshake(t, addr2, s.Data[dynamiccert.SecretCAKey], clk); leaf.CheckSignatureFrom(ca) != nil {
		t.Fatal("replica-2 serves a leaf the shared CA did not sign")
	}

	// Rotation: the successor's key is made in the token too.
	cfg := a1.Config()
	clk.SetTime(ca.NotAfter.Add(-cfg.CARenewBefore).Add(time.Minute))
	waitFor(t, "a successor CA with its key in the token", nil, func() bool {
		return len(getSecret(t, client).Data[authority.NextKeyRefKey]) > 0
	})
	s = getSecret(t, client)
	assertNoPrivateKey(t, s)
	clk.Step(testPropagation + time.Second)
	// Both replicas may have published a successor at once: the fake
	// clientset does not refuse a stale resourceVersion, so the last write
	// wins. Whichever it is, it signs once both replicas announced it.
	var nextRef string
	defer func() {
		if t.Failed() {
			s := getSecret(t, client)
			t.Logf("replica-1: %+v\nreplica-2: %+v\nlast errors: %v, %v\nsecret refs %q %q",
				a1.Status(), a2.Status(), a1.LastError(), a2.LastError(), s.Data[authority.KeyRefKey], s.Data[authority.NextKeyRefKey])
		}
	}()
	waitFor(t, "the successor to sign on both replicas", func() { clk.Step(time.Second) }, func() bool {
		s := getSecret(t, client)
		nextRef = string(s.Data[authority.KeyRefKey])
		return nextRef != ref &&
			a1.Leaf() != nil && a1.Leaf().CheckSignatureFrom(signingCA(t, s)) == nil &&
			a2.Leaf() != nil && a2.Leaf().CheckSignatureFrom(signingCA(t, s)) == nil
	})
	s = getSecret(t, client)
	assertNoPrivateKey(t, s)
	next := signingCA(t, s)
	assertKeyInToken(t, ks1, nextRef, next)
	for _, addr := range []string{addr1, addr2} {
		if leaf := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk); leaf.CheckSignatureFrom(next) != nil {
			t.Fatalf("%s serves a leaf the successor did not sign", addr)
		}
	}
}

// TestAuthorityCAKeySourceUnavailable: a token that is missing or refuses
// the PIN is a load error naming the token, retried with backoff until it
// is fixed; then the Authority starts.
func TestAuthorityCAKeySourceUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		// setup returns the token label and PIN file to use, and fix, which
		// makes them work.
		setup func(t *testing.T) (label, pin string, fix func())
	}{{
		name: "missing token", want: "could not find PKCS#11 token",
		setup: func(t *testing.T) (string, string, func()) {
			label := fmt.Sprintf("evercert-late-%d", tokenSeq.Add(1))
			pin := t.TempDir() + "/pin"
			if err := os.WriteFile(pin, []byte(userPIN), 0o600); err != nil {
				t.Fatal(err)
			}
			return label, pin, func() {
				if out, err := execInitToken(label); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
			}
		},
	}, {
		name: "wrong PIN", want: "CKR_PIN_INCORRECT",
		setup: func(t *testing.T) (string, string, func()) {
			label, pin := newToken(t)
			good, _ := os.ReadFile(pin)
			if err := os.WriteFile(pin, []byte("0000"), 0o600); err != nil {
				t.Fatal(err)
			}
			return label, pin, func() {
				if err := os.WriteFile(pin, good, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			label, pin, fix := tc.setup(t)
			ks := newKeySource(t, label, pin)
			client := fake.NewClientset()
			clk := clocktesting.NewFakeClock(testNow)
			name := "hsm-unavailable-" + strings.ReplaceAll(tc.name, " ", "-")
			a := newAuthority(t, client, clk, name, "replica-1", ks)
			run(t, a)
			waitFor(t, "the key source error", nil, func() bool { return a.LastError() != nil })
			err := a.LastError().Error()
			for _, want := range []string{`pkcs11 token "` + label + `"`, tc.want, "making CA"} {
				if !strings.Contains(err, want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if n := certmetricstest.LoadErrors(t, name); n < 1 {
				t.Errorf("load errors = %v, want counted", n)
			}
			if a.Leaf() != nil {
				t.Fatal("a leaf without a CA key")
			}
			fix()
			// The retry runs on the backoff timer: only the clock moves it.
			waitFor(t, "the Authority to start once the token works", func() { clk.Step(backoff.DefaultCap) }, func() bool { return a.Leaf() != nil })
			assertNoPrivateKey(t, getSecret(t, client))
		})
	}
}

func execInitToken(label string) ([]byte, error) {
	return initTokenCmd(label).CombinedOutput()
}

// deleteKey removes the key pair labelled ref from the token, as an
// operator (or an attacker with HSM access) would, through its own session.
func deleteKey(t testing.TB, label, pin, ref string) {
	t.Helper()
	p, err := os.ReadFile(pin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := crypto11.Configure(&crypto11.Config{Path: "/usr/lib/softhsm/libsofthsm2.so", TokenLabel: label, Pin: strings.TrimSpace(string(p))})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	key, err := ctx.FindKeyPair(nil, []byte(ref))
	if err != nil {
		t.Fatal(err)
	}
	if err := key.Delete(); err != nil {
		t.Fatal(err)
	}
}

// TestAuthorityCAKeyRemovedFromToken: the running replica fails to renew
// its leaf, naming the token and the key, keeps serving the last one and
// backs off; a replica that starts finds the key gone.
func TestAuthorityCAKeyRemovedFromToken(t *testing.T) {
	label, pin := newToken(t)
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a := newAuthority(t, client, clk, "hsm-removed", "replica-1", newKeySource(t, label, pin))
	run(t, a)
	waitFor(t, "the first leaf", nil, func() bool { return a.Leaf() != nil })
	s := getSecret(t, client)
	ref := string(s.Data[authority.KeyRefKey])
	addr := serve(t, a)
	first := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk)

	deleteKey(t, label, pin, ref)
	before := certmetricstest.LoadErrors(t, "hsm-removed")
	// The leaf is due: signing it needs the CA key.
	clk.SetTime(first.NotAfter.Add(-a.Config().RenewBefore).Add(time.Second))
	waitFor(t, "the failed renewal", nil, func() bool { return a.LastError() != nil })
	err := a.LastError().Error()
	for _, want := range []string{`pkcs11 token "` + label + `"`, ref} {
		if !strings.Contains(err, want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if n := certmetricstest.LoadErrors(t, "hsm-removed"); n <= before {
		t.Errorf("load errors %v, want more than %v", n, before)
	}
	if got := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk); !got.Equal(first) {
		t.Fatal("the last good leaf is not served any more")
	}
	// The retry, on the backoff timer, looks the key up again: it is gone.
	waitFor(t, "the retry to say the key is gone", func() { clk.Step(backoff.DefaultCap) }, func() bool {
		err := a.LastError()
		return err != nil && strings.Contains(err.Error(), `"`+ref+`" is not in the token`)
	})
	if got := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk); !got.Equal(first) {
		t.Fatal("the last good leaf is not served any more")
	}

	b := newAuthority(t, client, clk, "hsm-removed-2", "replica-2", newKeySource(t, label, pin))
	run(t, b)
	waitFor(t, "the new replica's error", nil, func() bool { return b.LastError() != nil })
	err = b.LastError().Error()
	for _, want := range []string{"ns/ca", authority.KeyRefKey, `pkcs11 token "` + label + `"`, `"` + ref + `" is not in the token`} {
		if !strings.Contains(err, want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if n := certmetricstest.LoadErrors(t, "hsm-removed-2"); n < 1 {
		t.Errorf("load errors = %v, want counted", n)
	}
}

// hangingSource is a CAKeySource whose keys stop answering while hang is
// set: an HSM that hangs. Signatures started then return once release is
// closed.
type hangingSource struct {
	authority.CAKeySource
	hang    atomic.Bool
	release chan struct{}
	started atomic.Int64
}

func (h *hangingSource) NewKey(ctx context.Context, kt dynamiccert.KeyType) (crypto.Signer, string, error) {
	k, ref, err := h.CAKeySource.NewKey(ctx, kt)
	if err != nil {
		return nil, "", err
	}
	return hangingSigner{k, h}, ref, nil
}

func (h *hangingSource) FindKey(ctx context.Context, ref string) (crypto.Signer, error) {
	k, err := h.CAKeySource.FindKey(ctx, ref)
	if err != nil {
		return nil, err
	}
	return hangingSigner{k, h}, nil
}

type hangingSigner struct {
	crypto.Signer
	h *hangingSource
}

func (s hangingSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if s.h.hang.Load() {
		s.h.started.Add(1)
		<-s.h.release
	}
	return s.Signer.Sign(r, digest, opts)
}

// TestAuthorityHSMStopsAnswering: a signature that hangs fails after
// CAKeyTimeout naming the token, is counted and retried with backoff, the
// last good leaf keeps serving, and the Authority recovers when the HSM
// answers again.
func TestAuthorityHSMStopsAnswering(t *testing.T) {
	label, pin := newToken(t)
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	h := &hangingSource{CAKeySource: newKeySource(t, label, pin), release: make(chan struct{})}
	a := newAuthorityTimeout(t, client, clk, "hsm-hangs", "replica-1", h, 5*time.Second)
	run(t, a)
	waitFor(t, "the first leaf", nil, func() bool { return a.Leaf() != nil })
	s := getSecret(t, client)
	addr := serve(t, a)
	first := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk)

	h.hang.Store(true)
	released := false
	defer func() {
		if !released {
			close(h.release)
		}
	}()
	clk.SetTime(first.NotAfter.Add(-a.Config().RenewBefore).Add(time.Second))
	waitFor(t, "a signature to hang", nil, func() bool { return h.started.Load() > 0 })
	waitFor(t, "the timeout", func() { clk.Step(time.Second) }, func() bool {
		err := a.LastError()
		return err != nil && strings.Contains(err.Error(), "did not answer")
	})
	if err := a.LastError().Error(); !strings.Contains(err, `pkcs11 token "`+label+`"`) {
		t.Errorf("error %q does not name the token", err)
	}
	if n := certmetricstest.LoadErrors(t, "hsm-hangs"); n < 1 {
		t.Errorf("load errors = %v, want counted", n)
	}
	if got := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk); !got.Equal(first) {
		t.Fatal("the last good leaf is not served any more")
	}
	// Retries while it hangs fail at once (one signature at a time waits
	// on the HSM), not a goroutine per retry.
	clk.Step(backoff.DefaultCap)
	clk.Step(backoff.DefaultCap)
	if n := h.started.Load(); n != 1 {
		t.Errorf("%d signatures wait on the hung HSM, want 1", n)
	}

	h.hang.Store(false)
	close(h.release)
	released = true
	waitFor(t, "a new leaf once the HSM answers", func() { clk.Step(backoff.DefaultCap) }, func() bool {
		l := a.Leaf()
		return l != nil && !l.Equal(first) && a.LastError() == nil
	})
	if got := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk); got.Equal(first) {
		t.Fatal("still serving the old leaf")
	}
}

// TestAuthorityWithoutCAKeysRefusesKeyRef: a replica configured without
// the key store cannot sign with a CA whose key is in it; it says which
// Secret and key, and the error is counted.
func TestAuthorityWithoutCAKeysRefusesKeyRef(t *testing.T) {
	label, pin := newToken(t)
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a := newAuthority(t, client, clk, "hsm-ref", "replica-1", newKeySource(t, label, pin))
	if err := a.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := getSecret(t, client)
	b := newAuthority(t, client, clk, "hsm-ref-nokeys", "replica-2", nil)
	run(t, b)
	waitFor(t, "the error", nil, func() bool { return b.LastError() != nil })
	err := b.LastError().Error()
	for _, want := range []string{"ns/ca", authority.KeyRefKey, "no CAKeys"} {
		if !strings.Contains(err, want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if n := certmetricstest.LoadErrors(t, "hsm-ref-nokeys"); n < 1 {
		t.Errorf("load errors = %v, want counted", n)
	}
	if after := getSecret(t, client); !bytes.Equal(after.Data[corev1.TLSCertKey], before.Data[corev1.TLSCertKey]) || after.Data[corev1.TLSPrivateKeyKey] != nil {
		t.Fatal("the replica without the key store rewrote the Secret")
	}
}

// TestAuthorityMovesPEMKeyIntoSoftHSM: an Authority given a key store on a
// Secret that holds its CA key as PEM keeps that CA signing, publishes a
// successor with its key in the token at once, and once the successor
// signs the Secret holds no private key.
func TestAuthorityMovesPEMKeyIntoSoftHSM(t *testing.T) {
	label, pin := newToken(t)
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	old := newAuthority(t, client, clk, "hsm-move-old", "replica-old", nil)
	if err := old.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(getSecret(t, client).Data[corev1.TLSPrivateKeyKey]) == 0 {
		t.Fatal("the Authority without a key store keeps the key in tls.key")
	}
	pemCA := signingCA(t, getSecret(t, client))

	a := newAuthority(t, client, clk, "hsm-move", "replica-1", newKeySource(t, label, pin))
	run(t, a)
	waitFor(t, "a leaf from the CA in the Secret and a successor in the token", nil, func() bool {
		return a.Leaf() != nil && len(getSecret(t, client).Data[authority.NextKeyRefKey]) > 0
	})
	if a.Leaf().CheckSignatureFrom(pemCA) != nil {
		t.Fatal("the CA in force stopped signing before its successor was observed")
	}
	clk.Step(testPropagation + time.Second)
	waitFor(t, "the successor to sign", func() { clk.Step(time.Second) }, func() bool {
		s := getSecret(t, client)
		return len(s.Data[authority.KeyRefKey]) > 0 && a.Leaf().CheckSignatureFrom(signingCA(t, s)) == nil
	})
	s := getSecret(t, client)
	assertNoPrivateKey(t, s)
	if k := s.Data[corev1.TLSPrivateKeyKey]; len(k) > 0 {
		// The kubernetes.io/tls type (the Secret predates the key store)
		// requires tls.key to exist: it stays, empty.
		t.Fatal("tls.key is still in the Secret")
	}
	addr := serve(t, a)
	if leaf := handshake(t, addr, s.Data[dynamiccert.SecretCAKey], clk); leaf.CheckSignatureFrom(signingCA(t, s)) != nil {
		t.Fatal("not serving a leaf from the CA in the token")
	}
}

// TestAuthoritySignLeafConcurrentlyWithKeyInSoftHSM: SignLeaf, which the
// PodCertificateRequest signer calls for many pods at once, signs
// concurrently with a CA key in the token.
func TestAuthoritySignLeafConcurrentlyWithKeyInSoftHSM(t *testing.T) {
	label, pin := newToken(t)
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(testNow)
	a := newAuthority(t, client, clk, "hsm-signleaf", "replica-1", newKeySource(t, label, pin))
	if err := a.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	ca := signingCA(t, getSecret(t, client))
	pod, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			leaf, err := a.SignLeaf(authority.LeafRequest{PublicKey: pod.Public(), DNSNames: []string{"pod.ns.svc"}, Lifetime: time.Hour})
			if err == nil {
				err = leaf.Cert.CheckSignatureFrom(ca)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}
