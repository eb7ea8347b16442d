package sni

import (
	"bytes"
	"context"
	"crypto/tls"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// runController runs c.Run (a controller's, or a provider's) until the test
// ends and waits for it to return.
func runController(t *testing.T, c interface{ Run(context.Context, int) }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, 1)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
}

func TestRotationThroughRun(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	first := issueLeaf(t, ca, leafSpec{cn: "svc.test", dns: []string{"svc.test"}, now: clk.Now()})
	second := issueLeaf(t, ca, leafSpec{cn: "svc.test", dns: []string{"svc.test"}, now: clk.Now()})
	sniFirst := issueLeaf(t, ca, leafSpec{cn: "sni.test", dns: []string{"sni.test"}, now: clk.Now()})
	sniSecond := issueLeaf(t, ca, leafSpec{cn: "sni.test", dns: []string{"sni.test"}, now: clk.Now()})

	serving := newMutable(t.Name()+"/serving", first)
	// Metrics are process-global: compare deltas, so -count=N works.
	rotationsBefore := metricValue(t, "evercert_certificate_rotations_total", t.Name()+"/serving")
	sni := newMutable(t.Name()+"/sni", sniFirst)
	c := newController(t, ControllerConfig{
		Serving: serving,
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{sni},
		Clock:   clk,
		Name:    "rotation-test",
	})
	swapped := make(chanListener, 1)
	c.AddListener(swapped)
	runController(t, c) // Run primes the controller itself
	waitFor(t, swapped, "the first snapshot")
	require.True(t, c.HasSynced())

	srv := startServer(t, c.TLSConfig())
	requireSerial(t, first, servedSerial(t, srv.addr, clientConfig(clk, "svc.test")))
	requireSerial(t, sniFirst, servedSerial(t, srv.addr, clientConfig(clk, "sni.test")))

	serving.SetIssued(second) // notifies the controller, which is listening
	waitFor(t, swapped, "the swap after the serving change")
	requireSerial(t, second, servedSerial(t, srv.addr, clientConfig(clk, "svc.test")))

	sni.SetIssued(sniSecond)
	waitFor(t, swapped, "the swap after the SNI change")
	requireSerial(t, sniSecond, servedSerial(t, srv.addr, clientConfig(clk, "sni.test")))
	requireSerial(t, second, servedSerial(t, srv.addr, clientConfig(clk, "svc.test")))

	assert.Equal(t, rotationsBefore+1, metricValue(t, "evercert_certificate_rotations_total", t.Name()+"/serving"))
	assert.Equal(t, float64(second.Cert.NotAfter.Unix()),
		metricValue(t, "evercert_certificate_expiration_timestamp_seconds", t.Name()+"/serving"))
}

func TestBadContentKeepsLastGood(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	good := issueLeaf(t, ca, leafSpec{cn: "svc.test", dns: []string{"svc.test"}, now: clk.Now()})
	other := issueLeaf(t, ca, leafSpec{cn: "svc.test", dns: []string{"svc.test"}, now: clk.Now()})
	shortLived := issueLeaf(t, ca, leafSpec{cn: "svc.test", dns: []string{"svc.test"}, now: clk.Now(), lifetime: time.Hour})

	tests := []struct {
		name string
		// bad returns the bad content; it may step the clock.
		bad  func() (cert, key []byte)
		want error
	}{
		{"malformed", func() ([]byte, []byte) { return []byte("-----BEGIN CERTIFICATE-----\nnope\n"), good.KeyPEM }, pki.ErrMalformedPEM},
		{"garbage after PEM", func() ([]byte, []byte) { return append(slices.Clone(other.CertPEM), "junk"...), other.KeyPEM }, pki.ErrMalformedPEM},
		{"empty", func() ([]byte, []byte) { return nil, nil }, pki.ErrEmpty},
		{"mismatched key", func() ([]byte, []byte) { return other.CertPEM, good.KeyPEM }, pki.ErrKeyMismatch},
		{"expired per the fake clock", func() ([]byte, []byte) {
			clk.Step(2 * time.Hour) // shortLived was valid for one hour
			return shortLived.CertPEM, shortLived.KeyPEM
		}, pki.ErrExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := t.Name()
			p := newMutable(name, good, "svc.test")
			c := newController(t, ControllerConfig{
				SNI:   []dynamiccertificates.SNICertKeyContentProvider{p},
				Clock: clk,
			})
			parses := countParses(c)
			_, err := c.sync(true)
			require.NoError(t, err)
			srv := startServer(t, c.TLSConfig())
			before := loadErrors(t, name)
			servedBefore := c.Served()

			p.setQuietly(tt.bad())
			retry, err := c.sync(true)
			require.NoError(t, err, "a bad provider is not a sync failure while the last good is served")
			assert.False(t, retry)
			assert.Equal(t, before+1, loadErrors(t, name), "load error counted")
			requireSerial(t, good, servedSerial(t, srv.addr, clientConfig(clk, "svc.test")), "last good kept")
			assert.Equal(t, servedBefore, c.Served())
			assert.Equal(t, 2, parses.get(name))

			// The same bad content again is neither parsed nor counted again.
			_, err = c.sync(true)
			require.NoError(t, err)
			assert.Equal(t, before+1, loadErrors(t, name))
			assert.Equal(t, 2, parses.get(name))

			// The error, as the rejection reports it, is what the test meant.
			var slot = c.sniSlots[0]
			require.ErrorIs(t, slot.badErr, tt.want)
			require.ErrorContains(t, slot.badErr, name, "the error names the provider")

			// Recovery: a new valid certificate (valid at the fake clock's now).
			fresh := issueLeaf(t, ca, leafSpec{cn: "svc.test", dns: []string{"svc.test"}, now: clk.Now()})
			p.setQuietly(fresh.CertPEM, fresh.KeyPEM)
			_, err = c.sync(true)
			require.NoError(t, err)
			requireSerial(t, fresh, servedSerial(t, srv.addr, clientConfig(clk, "svc.test")), "recovered")
			assert.Equal(t, before+1, loadErrors(t, name))
			assert.Nil(t, slot.badErr)
		})
	}
}

func TestNeverValidProviderIsLeftOut(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	serving := issueLeaf(t, ca, leafSpec{cn: "default.test", now: clk.Now()})
	bad := newMutable(t.Name()+"/bad", nil, "bad.test")
	bad.setQuietly([]byte("x"), []byte("y"))
	before := loadErrors(t, t.Name()+"/bad")
	c := newController(t, ControllerConfig{
		Serving: newMutable("serving", serving),
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{bad},
		Clock:   clk,
	})
	require.NoError(t, c.RunOnce(context.Background()))
	assert.Equal(t, before+1, loadErrors(t, t.Name()+"/bad"))
	require.Len(t, c.Served(), 1)
	srv := startServer(t, c.TLSConfig())
	requireSerial(t, serving, servedSerial(t, srv.addr, clientConfig(clk, "bad.test")))
}

func TestNotYetValidIsRetried(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	serving := issueLeaf(t, ca, leafSpec{cn: "default.test", now: clk.Now()})
	future := issueLeaf(t, ca, leafSpec{cn: "future.test", dns: []string{"future.test"}, now: clk.Now().Add(time.Hour)})
	name := t.Name() + "/future"
	c := newController(t, ControllerConfig{
		Serving: newMutable("serving", serving),
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{newMutable(name, future)},
		Clock:   clk,
	})
	parses := countParses(c)
	before := loadErrors(t, name)

	retry, err := c.sync(true)
	require.NoError(t, err)
	require.True(t, retry, "not yet valid may become valid by itself")
	require.ErrorIs(t, c.sniSlots[0].badErr, pki.ErrNotYetValid)
	assert.Equal(t, before+1, loadErrors(t, name))

	clk.Step(time.Hour)
	retry, err = c.sync(true)
	require.NoError(t, err)
	require.False(t, retry)
	assert.Equal(t, 2, parses.get(name), "re-parsed because time alone can make it valid")
	assert.Equal(t, before+1, loadErrors(t, name), "the same content is counted once")
	srv := startServer(t, c.TLSConfig())
	requireSerial(t, future, servedSerial(t, srv.addr, clientConfig(clk, "future.test")))
}

func TestUnchangedProviderIsNotReparsed(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	var providers []dynamiccertificates.SNICertKeyContentProvider
	var mutables []*mutableProvider
	for _, n := range []string{"p0", "p1", "p2"} {
		p := newMutable(n, issueLeaf(t, ca, leafSpec{cn: n + ".test", now: clk.Now()}))
		providers = append(providers, p)
		mutables = append(mutables, p)
	}
	servingIss := issueLeaf(t, ca, leafSpec{cn: "default.test", now: clk.Now()})
	serving := newMutable("serving", servingIss)
	c := newController(t, ControllerConfig{Serving: serving, SNI: providers, Clock: clk})
	parses := countParses(c)
	swaps := make(chanListener, 1)
	c.AddListener(swaps)

	require.NoError(t, c.RunOnce(context.Background()))
	waitFor(t, swaps, "first swap")
	for _, n := range []string{"serving", "p0", "p1", "p2"} {
		require.Equal(t, 1, parses.get(n), n)
	}
	before := c.current.Load()

	// Nothing changed: no parse, no swap, no notification.
	require.NoError(t, c.RunOnce(context.Background()))
	require.Same(t, before, c.current.Load())
	select {
	case <-swaps:
		t.Fatal("listener notified without a change")
	default:
	}

	// Same content in a new slice: compared by value, still not parsed.
	cert, key := mutables[0].CurrentCertKeyContent()
	mutables[0].setQuietly(bytes.Clone(cert), bytes.Clone(key))
	require.NoError(t, c.RunOnce(context.Background()))
	require.Same(t, before, c.current.Load())
	require.Equal(t, 1, parses.get("p0"))

	// One provider changes: only it is parsed; the others' certificates are
	// the very same objects in the new snapshot.
	mutables[1].SetIssued(issueLeaf(t, ca, leafSpec{cn: "p1.test", now: clk.Now()}))
	require.NoError(t, c.RunOnce(context.Background()))
	waitFor(t, swaps, "swap after the change")
	after := c.current.Load()
	require.NotSame(t, before, after)
	assert.Equal(t, 2, parses.get("p1"))
	for _, n := range []string{"serving", "p0", "p2"} {
		assert.Equal(t, 1, parses.get(n), n)
	}
	assert.Same(t, before.exact["p0.test"], after.exact["p0.test"])
	assert.Same(t, before.def, after.def)
	assert.NotSame(t, before.exact["p1.test"], after.exact["p1.test"])
}

func TestExplicitNamesChange(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	serving := issueLeaf(t, ca, leafSpec{cn: "default.test", now: clk.Now()})
	iss := issueLeaf(t, ca, leafSpec{cn: "a.test", now: clk.Now()})
	p := newMutable("names", iss, "a.test")
	c := newController(t, ControllerConfig{
		Serving: newMutable("serving", serving),
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{p},
		Clock:   clk,
	})
	parses := countParses(c)
	require.NoError(t, c.RunOnce(context.Background()))
	srv := startServer(t, c.TLSConfig())
	requireSerial(t, iss, servedSerial(t, srv.addr, clientConfig(clk, "a.test")))
	requireSerial(t, serving, servedSerial(t, srv.addr, clientConfig(clk, "b.test")), "b.test is not claimed yet")

	p.mu.Lock()
	p.names = []string{"B.test"}
	p.mu.Unlock()
	require.NoError(t, c.RunOnce(context.Background()))
	requireSerial(t, iss, servedSerial(t, srv.addr, clientConfig(clk, "b.test")))
	requireSerial(t, serving, servedSerial(t, srv.addr, clientConfig(clk, "a.test")))
	assert.Equal(t, 1, parses.get("names"), "a names change does not re-parse")

	// Duplicates are claimed once and do not look like a change on every sync.
	p.mu.Lock()
	p.names = []string{"b.test", "B.TEST", "c.test"}
	p.mu.Unlock()
	require.NoError(t, c.RunOnce(context.Background()))
	snap := c.current.Load()
	require.NoError(t, c.RunOnce(context.Background()))
	require.Same(t, snap, c.current.Load(), "unchanged names: no rebuild")
	served := c.Served()
	require.Len(t, served, 2)
	assert.Equal(t, []string{"b.test", "c.test"}, served[1].Names)
}

func TestClientCAChange(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	servingCA := newTestCA(t, clk.Now(), "serving-ca")
	ca1 := newTestCA(t, clk.Now(), "client-ca-1")
	ca2 := newTestCA(t, clk.Now(), "client-ca-2")
	clientCert := func(ca *pki.Issued) tls.Certificate {
		iss := issueLeaf(t, ca, leafSpec{cn: "client", now: clk.Now()})
		pair, err := tls.X509KeyPair(iss.CertPEM, iss.KeyPEM)
		require.NoError(t, err)
		return pair
	}
	from1, from2 := clientCert(ca1), clientCert(ca2)

	caName := t.Name() + "/client-ca"
	caProvider := &mutableCA{name: caName, bundle: ca1.CertPEM}
	serving := newMutable("serving", issueLeaf(t, servingCA, leafSpec{cn: "svc.test", dns: []string{"svc.test"}, now: clk.Now()}))
	c := newController(t, ControllerConfig{Base: &tls.Config{MinVersion: tls.VersionTLS12, Time: clk.Now}, ClientCA: caProvider, Serving: serving, Clock: clk})
	swapped := make(chanListener, 1)
	c.AddListener(swapped)
	runController(t, c)
	waitFor(t, swapped, "first snapshot")
	srv := startServer(t, c.TLSConfig())

	cfg, _ := c.GetConfigForClient(&tls.ClientHelloInfo{})
	require.Equal(t, tls.VerifyClientCertIfGiven, cfg.ClientAuth, "default with a client CA")

	handshake := func(cert *tls.Certificate) error {
		cc := &tls.Config{ServerName: "svc.test", RootCAs: x509Pool(t, servingCA), Time: clk.Now, MinVersion: tls.VersionTLS13}
		if cert != nil {
			// Always present the certificate: crypto/tls clients otherwise
			// send none when it is not from an acceptable CA, and the
			// server would never see it.
			cc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		_, err := dial(t, srv.addr, cc)
		return err
	}
	require.NoError(t, handshake(nil), "no client certificate is fine with VerifyClientCertIfGiven")
	require.NoError(t, handshake(&from1))
	require.Error(t, handshake(&from2), "CA2 is not trusted yet")

	caProvider.Set(append(slices.Clone(ca2.CertPEM), ca1.CertPEM...))
	waitFor(t, swapped, "swap after the client CA change")
	require.NoError(t, handshake(&from2), "CA2 trusted after the swap")
	require.NoError(t, handshake(&from1))

	var subjects []string
	for _, s := range c.Served() {
		if s.Role == RoleClientCA {
			subjects = append(subjects, s.Subject)
			assert.Equal(t, caName, s.Provider)
		}
	}
	assert.Equal(t, []string{"client-ca-2", "client-ca-1"}, subjects)

	caProvider.Set(ca2.CertPEM)
	waitFor(t, swapped, "swap after dropping CA1")
	require.Error(t, handshake(&from1), "CA1 no longer trusted")
	require.NoError(t, handshake(&from2))

	// A bad bundle is counted and the last good pool is kept.
	before := loadErrors(t, caName)
	caProvider.mu.Lock()
	caProvider.bundle = []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n")
	caProvider.mu.Unlock()
	_, err := c.sync(true)
	require.NoError(t, err)
	assert.Equal(t, before+1, loadErrors(t, caName))
	require.NoError(t, handshake(&from2), "last good client CA pool kept")
	require.Error(t, handshake(&from1))
}

func TestClientAuthResolution(t *testing.T) {
	ca := &mutableCA{name: "ca"}
	serving := newMutable("serving", nil)
	tests := []struct {
		name       string
		base       *tls.Config
		clientCA   dynamiccertificates.CAContentProvider
		clientAuth tls.ClientAuthType
		want       tls.ClientAuthType
	}{
		{"no client CA", nil, nil, tls.NoClientCert, tls.NoClientCert},
		{"client CA", nil, ca, tls.NoClientCert, tls.VerifyClientCertIfGiven},
		{"base setting kept", &tls.Config{ClientAuth: tls.RequestClientCert}, ca, tls.NoClientCert, tls.RequestClientCert},
		{"field wins", &tls.Config{ClientAuth: tls.RequestClientCert}, ca, tls.RequireAndVerifyClientCert, tls.RequireAndVerifyClientCert},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newController(t, ControllerConfig{Base: tt.base, ClientCA: tt.clientCA, Serving: serving, ClientAuth: tt.clientAuth})
			assert.Equal(t, tt.want, c.clientAuth)
		})
	}
}

// TestControllerConfigErrorsNameTheField: an invalid config is refused at
// construction, naming the field, instead of failing closed at the first
// handshake.
func TestControllerConfigErrorsNameTheField(t *testing.T) {
	serving := newMutable("serving", nil)
	tests := []struct {
		name string
		cfg  ControllerConfig
		want string
	}{
		{"nothing to serve", ControllerConfig{}, "neither Serving nor SNI"},
		{"only nil SNI entries", ControllerConfig{SNI: []dynamiccertificates.SNICertKeyContentProvider{nil}}, "neither Serving nor SNI"},
		{"verify without a client CA", ControllerConfig{Serving: serving, ClientAuth: tls.RequireAndVerifyClientCert}, "ControllerConfig.ClientAuth RequireAndVerifyClientCert verifies client certificates but ControllerConfig.ClientCA is not set"},
		{"base verifies without a client CA", ControllerConfig{Serving: serving, Base: &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven}}, "ControllerConfig.Base.ClientAuth"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewDynamicServingCertificateController(tt.cfg)
			require.ErrorContains(t, err, tt.want)
			assert.Nil(t, c)
		})
	}
}

func TestNilBaseAndTLSConfig(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	c := newController(t, ControllerConfig{Serving: newMutable("serving", issueLeaf(t, ca, leafSpec{cn: "x.test", now: clk.Now()})), Clock: clk})
	require.NoError(t, c.RunOnce(context.Background()))

	outer := c.TLSConfig()
	require.Equal(t, uint16(tls.VersionTLS12), outer.MinVersion)
	require.NotNil(t, outer.GetConfigForClient)
	require.NotSame(t, outer, c.TLSConfig(), "each call returns a new config")

	inner, err := outer.GetConfigForClient(&tls.ClientHelloInfo{})
	require.NoError(t, err)
	require.Nil(t, inner.Certificates)
	require.Nil(t, inner.GetConfigForClient)
	require.NotNil(t, inner.GetCertificate)
	require.Equal(t, uint16(tls.VersionTLS12), inner.MinVersion)
	require.Nil(t, inner.ClientCAs)

	// Base is cloned: changing the caller's config later has no effect.
	base := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"h2", "http/1.1"}}
	c2 := newController(t, ControllerConfig{Base: base, Serving: newMutable("serving", issueLeaf(t, ca, leafSpec{cn: "x.test", now: clk.Now()})), Clock: clk})
	base.MinVersion = tls.VersionTLS10
	require.NoError(t, c2.RunOnce(context.Background()))
	inner, _ = c2.GetConfigForClient(nil)
	require.Equal(t, uint16(tls.VersionTLS13), inner.MinVersion)
	require.Equal(t, []string{"h2", "http/1.1"}, inner.NextProtos)
}

// TestSessionResumptionAcrossSwap checks that TLS 1.3 tickets issued before
// a snapshot swap are accepted after it: the per-snapshot configs have no
// ticket keys of their own, so crypto/tls uses the listener config's.
func TestSessionResumptionAcrossSwap(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	serving := newMutable("serving", issueLeaf(t, ca, leafSpec{cn: "svc.test", dns: []string{"svc.test"}, now: clk.Now()}))
	unrelated := newMutable(t.Name()+"/unrelated", issueLeaf(t, ca, leafSpec{cn: "other.test", now: clk.Now()}))
	c := newController(t, ControllerConfig{
		Serving: serving,
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{unrelated},
		Clock:   clk,
	})
	require.NoError(t, c.RunOnce(context.Background()))
	srv := startServer(t, c.TLSConfig())

	cc := &tls.Config{
		ServerName:         "svc.test",
		RootCAs:            x509Pool(t, ca),
		Time:               clk.Now,
		MinVersion:         tls.VersionTLS13,
		ClientSessionCache: tls.NewLRUClientSessionCache(8),
	}
	st, err := dial(t, srv.addr, cc)
	require.NoError(t, err)
	require.False(t, st.DidResume)
	st, err = dial(t, srv.addr, cc)
	require.NoError(t, err)
	require.True(t, st.DidResume, "resumption works at all")

	before, _ := c.GetConfigForClient(nil)
	unrelated.SetIssued(issueLeaf(t, ca, leafSpec{cn: "other.test", now: clk.Now()}))
	require.NoError(t, c.RunOnce(context.Background()))
	after, _ := c.GetConfigForClient(nil)
	require.NotSame(t, before, after, "the snapshot was swapped")

	st, err = dial(t, srv.addr, cc)
	require.NoError(t, err)
	require.True(t, st.DidResume, "a ticket from before the swap resumes after it")
}

func TestListenersAndEnqueueAfterRun(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	p := newMutable("serving", issueLeaf(t, ca, leafSpec{cn: "x.test", now: clk.Now()}))
	c := newController(t, ControllerConfig{Serving: p, Clock: clk, ResyncInterval: -1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, 4) }()
	for i := 0; !c.HasSynced(); i++ {
		require.Less(t, i, 1000, "Run did not prime the controller")
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	c.Enqueue() // after shutdown: ignored, must not panic or block
	p.SetIssued(issueLeaf(t, ca, leafSpec{cn: "x.test", now: clk.Now()}))
}
