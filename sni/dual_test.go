package sni

import (
	"context"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// The clients of the dual-certificate tests, as issue 14 names them.
type dualClient string

const (
	// goDefault is a Go client with default settings: it supports ECDSA.
	goDefault dualClient = "go-default"
	// goRSA12 is a Go client limited to TLS 1.2 and an RSA cipher suite.
	goRSA12 dualClient = "go-tls12-rsa-suite"
	// opensslRSA13 is openssl s_client on TLS 1.3 offering RSA-PSS
	// signatures only.
	opensslRSA13 dualClient = "openssl-tls13-rsa-pss"
	// opensslDefault is openssl s_client with default settings.
	opensslDefault dualClient = "openssl-default"
)

var allDualClients = []dualClient{goDefault, goRSA12, opensslRSA13, opensslDefault}

// rsaOnlySigalgs is what opensslRSA13 offers.
var rsaOnlySigalgs = []string{"-tls1_3", "-sigalgs", "rsa_pss_rsae_sha256:rsa_pss_pss_sha256"}

// rsaOnlyTLS12 limits a Go client to TLS 1.2 and RSA key signatures.
func rsaOnlyTLS12(cfg *tls.Config) *tls.Config {
	cfg.MaxVersion = tls.VersionTLS12
	cfg.CipherSuites = []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}
	return cfg
}

// handshakeAs handshakes with addr as client and returns the leaf served.
// cfg is the base Go client config (server name, roots, clock).
func handshakeAs(t *testing.T, client dualClient, addr string, cfg *tls.Config) (*x509.Certificate, error) {
	t.Helper()
	switch client {
	case goDefault:
		return tlstest.Handshake(addr, cfg)
	case goRSA12:
		return tlstest.Handshake(addr, rsaOnlyTLS12(cfg))
	case opensslRSA13:
		return tlstest.OpenSSL(t, addr, cfg.ServerName, rsaOnlySigalgs...)
	case opensslDefault:
		return tlstest.OpenSSL(t, addr, cfg.ServerName)
	}
	t.Fatalf("unknown client %q", client)
	return nil, nil
}

// wantsRSA reports whether client cannot use an ECDSA certificate.
func (c dualClient) wantsRSA() bool { return c == goRSA12 || c == opensslRSA13 }

// TestDualCertificateSelection serves names with an ECDSA and an RSA
// certificate through the controller's Run loop, and checks with real
// handshakes from Go and openssl clients that each client gets the
// certificate it supports, ECDSA whenever it can; that the same key
// algorithm twice keeps "earlier wins"; that name-only names take no
// alternative; that an alternative rotates on its own; and what Served
// reports.
func TestDualCertificateSelection(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "dual-ca")
	leaf := func(kt pki.KeyType, dns ...string) *pki.Issued {
		return issueLeaf(t, ca, leafSpec{cn: dns[0], dns: dns, ips: []net.IP{net.IPv4(127, 0, 0, 1)}, now: clk.Now(), keyType: kt})
	}
	certs := map[string]*pki.Issued{
		"default-e": leaf(pki.ECDSAP256, "default.test"),
		"default-r": leaf(pki.RSA2048, "default.test"),
		"dual-e":    leaf(pki.ECDSAP256, "dual.test", "*.wild.test"),
		"dual-r":    leaf(pki.RSA2048, "dual.test", "*.wild.test"),
		"order-r":   leaf(pki.RSA2048, "order.test"),
		"order-e":   leaf(pki.ECDSAP256, "order.test"),
		"same-1":    leaf(pki.ECDSAP256, "same.test"),
		"same-2":    leaf(pki.ECDSAP384, "same.test"),
		"internal":  leaf(pki.ECDSAP256, "internal"),
		"internal-r": issueLeaf(t, ca, leafSpec{cn: "internal.test", dns: []string{"internal.test"}, now: clk.Now(),
			keyType: pki.RSA2048}),
	}
	internal := &nameOnly{newMutable("internal", certs["internal"], "internal.test")}
	providers := map[string]*mutableProvider{}
	sniCerts := []dynamiccertificates.SNICertKeyContentProvider{}
	for _, name := range []string{"dual-e", "dual-r", "order-r", "order-e", "same-1", "same-2", "internal-r", "default-r"} {
		providers[name] = newMutable(name, certs[name])
		sniCerts = append(sniCerts, providers[name])
	}
	sniCerts = append(sniCerts, internal)
	c := newController(t, ControllerConfig{Serving: newMutable("default-e", certs["default-e"]), SNI: sniCerts, Clock: clk})
	runController(t, c)
	require.Eventually(t, c.HasSynced, 30*time.Second, 5*time.Millisecond)
	addr := startServer(t, c.TLSConfig()).addr

	for _, tc := range []struct {
		serverName string
		ecdsa, rsa string // the certificate each kind of client gets; "" fails
	}{
		{"", "default-e", "default-r"},             // the default and its same-names RSA twin
		{"default.test", "default-e", "default-r"}, // the serving certificate joins a name its RSA twin claimed
		{"nomatch.test", "default-e", "default-r"}, // the default, for an unknown name
		{"dual.test", "dual-e", "dual-r"},          // two providers, one name
		{"a.wild.test", "dual-e", "dual-r"},        // ... and one wildcard
		{"order.test", "order-e", "order-r"},       // ECDSA first, whatever the provider order
		{"same.test", "same-1", ""},                // same algorithm: the earlier wins, no RSA
		{"internal.test", "internal", ""},          // name-only: no alternative joins
	} {
		for _, client := range allDualClients {
			want := tc.ecdsa
			if client.wantsRSA() {
				want = tc.rsa
			}
			served, err := handshakeAs(t, client, addr, clientConfig(clk, tc.serverName))
			if want == "" {
				require.Error(t, err, "%s, server name %q: no certificate it supports", client, tc.serverName)
				continue
			}
			require.NoError(t, err, "%s, server name %q", client, tc.serverName)
			assert.Equal(t, certs[want].Cert.SerialNumber, served.SerialNumber, "%s, server name %q: want %s", client, tc.serverName, want)
		}
	}

	served := map[string]ServedCertificate{}
	for _, sc := range c.Served() {
		served[sc.Provider] = sc
	}
	assert.Equal(t, "ECDSA", served["dual-e"].KeyAlgorithm)
	assert.Equal(t, "RSA", served["dual-r"].KeyAlgorithm)
	assert.Equal(t, []string{"dual.test", "*.wild.test"}, served["dual-e"].Names)
	assert.Equal(t, []string{"dual.test", "*.wild.test"}, served["dual-r"].Names, "an alternative is selected for the names it shares")
	assert.Equal(t, []string{"default.test"}, served["default-e"].Names, "the serving certificate is listed for the names it joined")
	assert.True(t, served["default-e"].IsDefault)
	assert.True(t, served["default-r"].IsDefault, "the same-names RSA twin is the default's alternative")
	assert.False(t, served["dual-e"].IsDefault)
	assert.Empty(t, served["same-2"].Names, "same key algorithm: the earlier provider wins")
	assert.Empty(t, served["internal-r"].Names, "a name-only provider's names take no alternative")

	// An alternative rotates on its own; the other certificate stays.
	next := leaf(pki.RSA2048, "dual.test", "*.wild.test")
	providers["dual-r"].SetIssued(next)
	require.Eventually(t, func() bool {
		got, err := handshakeAs(t, goRSA12, addr, clientConfig(clk, "dual.test"))
		return err == nil && got.SerialNumber.Cmp(next.Cert.SerialNumber) == 0
	}, 10*time.Second, 10*time.Millisecond)
	got, err := handshakeAs(t, goDefault, addr, clientConfig(clk, "dual.test"))
	require.NoError(t, err)
	assert.Equal(t, certs["dual-e"].Cert.SerialNumber, got.SerialNumber)
}

// nameOnly makes a test provider name-only.
type nameOnly struct{ *mutableProvider }

func (nameOnly) NameOnly() bool { return true }

// TestDualCertificateByLocalIP: two providers that register the same
// explicit IP with different key algorithms are both selected for clients
// that send no SNI to that IP.
func TestDualCertificateByLocalIP(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "dual-ip-ca")
	leaf := func(kt pki.KeyType, cn string) *pki.Issued {
		return issueLeaf(t, ca, leafSpec{cn: cn, ips: []net.IP{net.IPv4(127, 0, 0, 1)}, now: clk.Now(), keyType: kt})
	}
	def, ipE, ipR := leaf(pki.ECDSAP256, "default"), leaf(pki.ECDSAP256, "ip-e"), leaf(pki.RSA2048, "ip-r")
	c := newController(t, ControllerConfig{
		Serving: newMutable("default", def),
		SNI: []dynamiccertificates.SNICertKeyContentProvider{
			newMutable("ip-r", ipR, "127.0.0.1"), newMutable("ip-e", ipE, "127.0.0.1"),
		},
		Clock: clk,
	})
	runController(t, c)
	require.Eventually(t, c.HasSynced, 30*time.Second, 5*time.Millisecond)
	addr := startServer(t, c.TLSConfig()).addr
	for _, client := range allDualClients {
		want := ipE
		if client.wantsRSA() {
			want = ipR
		}
		served, err := handshakeAs(t, client, addr, clientConfig(clk, ""))
		require.NoError(t, err, client)
		assert.Equal(t, want.Cert.SerialNumber, served.SerialNumber, "%s: want %s", client, want.Cert.Subject.CommonName)
	}
}

// TestDualDefaultFromSNI: an RSA serving certificate and an ECDSA SNI
// certificate for the same names (--tls-cert-file rsa plus
// --tls-sni-cert-key ecdsa): a hello without SNI still gets ECDSA when it
// can, and RSA when it cannot.
func TestDualDefaultFromSNI(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "dual-default-ca")
	leaf := func(kt pki.KeyType) *pki.Issued {
		return issueLeaf(t, ca, leafSpec{cn: "localhost", dns: []string{"localhost"}, ips: []net.IP{net.IPv4(127, 0, 0, 1)}, now: clk.Now(), keyType: kt})
	}
	rsaPair, ecdsaPair := leaf(pki.RSA2048), leaf(pki.ECDSAP256)
	c := newController(t, ControllerConfig{
		Serving: newMutable("serving-rsa", rsaPair),
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{newMutable("sni-ecdsa", ecdsaPair)},
		Clock:   clk,
	})
	runController(t, c)
	require.Eventually(t, c.HasSynced, 30*time.Second, 5*time.Millisecond)
	addr := startServer(t, c.TLSConfig()).addr
	for _, serverName := range []string{"", "localhost"} {
		for _, client := range allDualClients {
			want := ecdsaPair
			if client.wantsRSA() {
				want = rsaPair
			}
			served, err := handshakeAs(t, client, addr, clientConfig(clk, serverName))
			require.NoError(t, err, "%s, server name %q", client, serverName)
			assert.Equal(t, want.Cert.SerialNumber, served.SerialNumber, "%s, server name %q", client, serverName)
		}
	}
}

// TestDualSelfSignedRotatesTogether runs a self-signed provider with an
// ECDSA and an RSA leaf and the controller, both through their Run loops on
// a fake clock, across several CA lifetimes. After every step an ECDSA
// client and an RSA-only client must verify what they are served against
// the CA bundle published before the step, and the two leaves must always
// be the provider's current pair: they rotate together.
func TestDualSelfSignedRotatesTogether(t *testing.T) {
	const lifetime = time.Hour
	clk := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	ss, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Name: "dual-self-signed", Lifetime: lifetime, Clock: clk,
		KeyTypes: []dynamiccert.KeyType{dynamiccert.ECDSAP256, dynamiccert.RSA2048},
	})
	require.NoError(t, err)
	alts := ss.Alternatives()
	require.Len(t, alts, 1)
	assert.Equal(t, "dual-self-signed/rsa-2048", alts[0].Name())
	rsaLeaf := alts[0].(interface{ Leaf() *x509.Certificate })
	_, caIsRSA := mustParseCA(t, ss.CurrentCABundleContent()).PublicKey.(*rsa.PublicKey)
	assert.True(t, caIsRSA, "with an RSA leaf the CA is RSA, so RSA-only clients can verify both chains")

	c := newController(t, ControllerConfig{Serving: ss, Clock: clk})
	runProvider(t, ss)
	runController(t, c)
	require.Eventually(t, c.HasSynced, 30*time.Second, 5*time.Millisecond)
	addr := startServer(t, c.TLSConfig()).addr

	bundle := ss.CurrentCABundleContent()
	ecdsaSerials, rsaSerials := map[string]bool{}, map[string]bool{}
	for step := range 90 { // nine leaf lifetimes, three CA lifetimes
		clk.Step(lifetime / 10)
		// The provider's loop has taken the step once it waits again.
		require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
		wantE, wantR := ss.Leaf().SerialNumber, rsaLeaf.Leaf().SerialNumber
		for _, client := range []dualClient{goDefault, goRSA12} {
			want := wantE
			if client.wantsRSA() {
				want = wantR
			}
			cfg := &tls.Config{ServerName: "localhost", RootCAs: tlstest.Pool(t, bundle), Time: clk.Now}
			require.Eventually(t, func() bool {
				got, err := handshakeAs(t, client, addr, cfg.Clone())
				return err == nil && got.SerialNumber.Cmp(want) == 0
			}, 10*time.Second, 5*time.Millisecond, "step %d, %s: the current leaf, verified with the bundle of the previous step", step, client)
		}
		ecdsaSerials[wantE.String()], rsaSerials[wantR.String()] = true, true
		bundle = ss.CurrentCABundleContent()
	}
	// Renewed at 2/3 of their life over nine lifetimes: about 13 leaves
	// each, and as many of one type as of the other.
	assert.Greater(t, len(ecdsaSerials), 10)
	assert.Len(t, rsaSerials, len(ecdsaSerials), "the two leaves rotate together")
}

// runProvider runs p until the test ends.
func runProvider(t *testing.T, p dynamiccertificates.ControllerRunner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx, 1)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("provider Run did not return after its context was cancelled")
		}
	})
}

func mustParseCA(t *testing.T, bundle []byte) *x509.Certificate {
	t.Helper()
	cas, err := pki.ParseCABundle(bundle)
	require.NoError(t, err)
	require.NotEmpty(t, cas)
	return cas[0]
}

// captureHello returns the ClientHelloInfo crypto/tls hands to
// GetCertificate when client connects to a server with a default config:
// a real hello, for measuring selection without a handshake around it.
func captureHello(t testing.TB, client *tls.Config) *tls.ClientHelloInfo {
	t.Helper()
	got := make(chan *tls.ClientHelloInfo, 1)
	addr := tlstest.Server(t, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		select {
		case got <- h:
		default:
		}
		return nil, errors.New("hello captured; no certificate")
	}})
	_, _ = tlstest.Handshake(addr, client) // fails by design
	select {
	case h := <-got:
		return h
	case <-time.After(10 * time.Second):
		t.Fatal("no ClientHello captured")
		return nil
	}
}

// dualAllocFixture is a controller, synced once, whose default and
// dual.test have an ECDSA and an RSA certificate and whose single.test has
// one ECDSA certificate.
type dualAllocFixture struct {
	clk        *clocktesting.FakeClock
	c          *DynamicServingCertificateController
	ecdsa, rsa *tls.Certificate // what dual.test and the default serve
}

func newDualAllocFixture(t testing.TB) *dualAllocFixture {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "dual-alloc-ca")
	leaf := func(kt pki.KeyType, dns ...string) *pki.Issued {
		return issueLeaf(t, ca, leafSpec{cn: dns[0], dns: dns, ips: []net.IP{net.IPv4(127, 0, 0, 1)}, now: clk.Now(), keyType: kt})
	}
	c := newController(t, ControllerConfig{
		Serving: newMutable("dual-e", leaf(pki.ECDSAP256, "dual.test")),
		SNI: []dynamiccertificates.SNICertKeyContentProvider{
			newMutable("dual-r", leaf(pki.RSA2048, "dual.test")),
			newMutable("single", leaf(pki.ECDSAP256, "single.test")),
		},
		Clock: clk,
	})
	require.NoError(t, c.RunOnce(context.Background()))
	f := &dualAllocFixture{clk: clk, c: c}
	s := c.current.Load()
	require.Len(t, s.def.certs, 2)
	f.ecdsa, f.rsa = s.def.certs[0], s.def.certs[1]
	return f
}
