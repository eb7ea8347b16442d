package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certutil "k8s.io/client-go/util/cert"
	clienttesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/klogtest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// servingConfig serves whatever p currently holds, parsing it on every
// handshake: the simplest correct server, so these tests exercise the
// provider and not the sni controller.
func servingConfig(p interface{ CurrentCertKeyContent() ([]byte, []byte) }) *tls.Config {
	return &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		cert, key := p.CurrentCertKeyContent()
		c, err := tls.X509KeyPair(cert, key)
		return &c, err
	}}
}

func TestSelfSignedDefaults(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s, err := NewSelfSigned(SelfSignedConfig{Clock: clienttesting.NewFakeClock(now)})
	require.NoError(t, err)

	leaf := s.Leaf()
	assert.Equal(t, "localhost", leaf.Subject.CommonName)
	assert.Equal(t, []string{"localhost"}, leaf.DNSNames)
	require.Len(t, leaf.IPAddresses, 2)
	assert.True(t, leaf.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")))
	assert.True(t, leaf.IPAddresses[1].Equal(net.ParseIP("::1")))
	assert.Contains(t, leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	assert.False(t, leaf.IsCA)
	key, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	require.True(t, ok, "default key is ECDSA, got %T", leaf.PublicKey)
	assert.Equal(t, elliptic.P256(), key.Curve)
	assert.Equal(t, now.Add(-DefaultSkewTolerance), leaf.NotBefore, "NotBefore is backdated by the skew tolerance")
	assert.Equal(t, DefaultSkewTolerance, s.Config().SkewTolerance)
	assert.Equal(t, (s.Config().CARenewBefore-s.Config().RenewBefore)/4, s.Config().PropagationDelay)
	assert.Equal(t, now.Add(DefaultSelfSignedLifetime), leaf.NotAfter)
	assert.Greater(t, leaf.SerialNumber.BitLen(), 64, "serial is random 128-bit")
	assert.Equal(t, leaf.NotAfter.Add(-DefaultSelfSignedLifetime/3), s.RenewAt(), "renews at 2/3 of the lifetime")

	pool := tlstest.Pool(t, s.CurrentCABundleContent())
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "localhost", CurrentTime: now})
	require.NoError(t, err)
	opts, ok := s.VerifyOptions()
	require.True(t, ok)
	assert.NotNil(t, opts.Roots)
}

func TestSelfSignedKeyTypes(t *testing.T) {
	for _, kt := range dynamiccert.KeyTypes {
		t.Run(string(kt), func(t *testing.T) {
			s, err := NewSelfSigned(SelfSignedConfig{KeyTypes: []dynamiccert.KeyType{kt}, Hosts: []string{"example.test"}})
			require.NoError(t, err)
			switch pub := s.Leaf().PublicKey.(type) {
			case *ecdsa.PublicKey:
				want := map[dynamiccert.KeyType]int{dynamiccert.ECDSAP256: 256, dynamiccert.ECDSAP384: 384}[kt]
				assert.Equal(t, want, pub.Curve.Params().BitSize)
			case *rsa.PublicKey:
				want := map[dynamiccert.KeyType]int{dynamiccert.RSA2048: 2048, dynamiccert.RSA3072: 3072}[kt]
				assert.Equal(t, want, pub.N.BitLen())
			default:
				t.Fatalf("unexpected key %T", pub)
			}
			cert, key := s.CurrentCertKeyContent()
			_, err = pki.ParseCertKey(cert, key, time.Now())
			require.NoError(t, err)
		})
	}
}

func TestSelfSignedConfigErrors(t *testing.T) {
	for name, cfg := range map[string]SelfSignedConfig{
		"unknown key type":          {KeyTypes: []dynamiccert.KeyType{"dsa-1024"}},
		"key type twice":            {KeyTypes: []dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA2048, "ECDSA-P256"}},
		"renew-before >= lifetime":  {Lifetime: time.Hour, RenewBefore: time.Hour},
		"negative lifetime":         {Lifetime: -time.Hour},
		"CA renew-before too short": {Lifetime: time.Hour, CALifetime: 3 * time.Hour, CARenewBefore: 10 * time.Minute},
		"propagation too long":      {Lifetime: time.Hour, PropagationDelay: 10 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewSelfSigned(cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), `self-signed provider "self-signed"`)
		})
	}
}

// TestSelfSignedRotationManyLifetimes walks a fake clock through 300 leaf
// lifetimes (100 CA lifetimes) in steps of a tenth of a lifetime. At every
// step a real TLS client, whose clock is the fake clock and who trusts only
// the CA bundle it fetched one step earlier, must complete a handshake.
func TestSelfSignedRotationManyLifetimes(t *testing.T) {
	t.Parallel() // see guard
	const lifetime = time.Hour
	clk := clienttesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := NewSelfSigned(SelfSignedConfig{Lifetime: lifetime, Clock: clk})
	require.NoError(t, err)
	changes := &countingListener{}
	s.AddListener(changes)
	addr := tlstest.Server(t, servingConfig(s))

	previousBundle := s.CurrentCABundleContent()
	leafSerials := map[string]bool{}
	caSerials := map[string]bool{}
	for step := range 3000 {
		clk.Step(lifetime / 10)
		require.NoError(t, s.RunOnce(context.Background()))
		served, err := tlstest.Handshake(addr, &tls.Config{
			ServerName: "localhost",
			RootCAs:    tlstest.Pool(t, previousBundle),
			Time:       clk.Now,
		})
		require.NoError(t, err, "step %d at %s: a client holding the previous bundle must verify the new leaf", step, clk.Now())
		leafSerials[served.SerialNumber.String()] = true
		for _, c := range mustParseBundle(t, s.CurrentCABundleContent()) {
			caSerials[c.SerialNumber.String()] = true
			assert.True(t, clk.Now().Before(c.NotAfter), "expired CAs leave the bundle")
		}
		previousBundle = s.CurrentCABundleContent()
	}
	// 300 lifetimes renewed at 2/3 each: about 450 leaves; CAs live three
	// lifetimes and are renewed at 2/3: about 150.
	assert.Greater(t, len(leafSerials), 400)
	assert.Greater(t, len(caSerials), 140)
	assert.GreaterOrEqual(t, changes.n.Load(), int64(len(leafSerials)-1))
}

func TestSelfSignedClockJumps(t *testing.T) {
	const lifetime = time.Hour
	clk := clienttesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := NewSelfSigned(SelfSignedConfig{Lifetime: lifetime, Clock: clk})
	require.NoError(t, err)
	addr := tlstest.Server(t, servingConfig(s))
	handshake := func() (*x509.Certificate, error) {
		return tlstest.Handshake(addr, &tls.Config{
			ServerName: "localhost", RootCAs: tlstest.Pool(t, s.CurrentCABundleContent()), Time: clk.Now,
		})
	}
	first := s.Leaf()

	// A machine suspended for a year wakes up: everything expired, and one
	// check makes a valid CA and leaf.
	clk.Step(365 * 24 * time.Hour)
	_, err = handshake()
	require.Error(t, err, "before the check the old leaf is expired")
	require.NoError(t, s.RunOnce(context.Background()))
	served, err := handshake()
	require.NoError(t, err)
	assert.NotEqual(t, first.SerialNumber, served.SerialNumber)

	// A small step back (NTP correction) stays inside the backdated NotBefore.
	clk.SetTime(clk.Now().Add(-time.Minute))
	require.NoError(t, s.RunOnce(context.Background()))
	again, err := handshake()
	require.NoError(t, err)
	assert.Equal(t, served.SerialNumber, again.SerialNumber, "a small backward step needs no new leaf")

	// A large step back, before the leaf's NotBefore, re-issues.
	clk.SetTime(clk.Now().Add(-time.Hour))
	require.NoError(t, s.RunOnce(context.Background()))
	_, err = handshake()
	require.NoError(t, err)
}

func TestSelfSignedRunRotatesOnTimer(t *testing.T) {
	const lifetime = time.Hour
	clk := clienttesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := NewSelfSigned(SelfSignedConfig{Lifetime: lifetime, Clock: clk})
	require.NoError(t, err)
	changes := &countingListener{}
	s.AddListener(changes)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx, 1)
	}()
	first := s.Leaf().SerialNumber
	require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond)
	for range 20 {
		// The check interval (lifetime/10) wakes the loop.
		clk.Step(lifetime / 10)
		time.Sleep(time.Millisecond)
	}
	require.Eventually(t, func() bool { return s.Leaf().SerialNumber.Cmp(first) != 0 }, 5*time.Second, time.Millisecond)
	assert.Positive(t, changes.n.Load())
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func mustParseBundle(t *testing.T, bundle []byte) []*x509.Certificate {
	t.Helper()
	certs, err := pki.ParseCABundle(bundle)
	require.NoError(t, err)
	return certs
}

// BenchmarkSelfSignedGenerate measures making a CA and a leaf signed by it,
// against upstream's certutil.GenerateSelfSignedCertKey (two RSA-2048 keys),
// which k8s.io/apiserver uses for its loopback and self-signed certificates.
func BenchmarkSelfSignedGenerate(b *testing.B) {
	klogtest.Discard(b)
	for _, kt := range []dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA2048} {
		b.Run("evercert/"+string(kt), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewSelfSigned(SelfSignedConfig{KeyTypes: []dynamiccert.KeyType{kt}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("upstream/rsa-2048", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := certutil.GenerateSelfSignedCertKey("localhost", nil, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestSelfSignedSleepsThroughPropagation checks that when the machine wakes
// up after the signing CA expired but while its published successor is
// valid, the successor signs: a client holding the bundle from before the
// sleep still verifies the new leaf.
func TestSelfSignedSleepsThroughPropagation(t *testing.T) {
	const lifetime = time.Hour
	clk := clienttesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := NewSelfSigned(SelfSignedConfig{Lifetime: lifetime, Clock: clk})
	require.NoError(t, err)
	caEnd := mustParseBundle(t, s.CurrentCABundleContent())[0].NotAfter
	// Enter the CA renew window (CARenewBefore = lifetime): the successor is
	// published.
	clk.SetTime(caEnd.Add(-lifetime + time.Minute))
	require.NoError(t, s.RunOnce(context.Background()))
	bundle := s.CurrentCABundleContent()
	require.Len(t, mustParseBundle(t, bundle), 2)
	// Sleep past the old CA's expiry.
	clk.SetTime(caEnd.Add(time.Minute))
	require.NoError(t, s.RunOnce(context.Background()))
	_, err = s.Leaf().Verify(x509.VerifyOptions{Roots: tlstest.Pool(t, bundle), DNSName: "localhost", CurrentTime: clk.Now()})
	require.NoError(t, err, "the published successor signs after the sleep")
}
