package sni

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/pki"
)

// ---- certificates ----

func newTestCA(t testing.TB, now time.Time, cn string) *pki.Issued {
	t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: cn, Now: now, Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	return ca
}

type leafSpec struct {
	cn       string
	dns      []string
	ips      []net.IP
	now      time.Time
	lifetime time.Duration
	keyType  pki.KeyType
}

func issueLeaf(t testing.TB, ca *pki.Issued, spec leafSpec) *pki.Issued {
	t.Helper()
	if spec.lifetime == 0 {
		spec.lifetime = 12 * time.Hour
	}
	leaf, err := pki.IssueLeaf(ca, pki.Request{
		CommonName: spec.cn, DNSNames: spec.dns, IPs: spec.ips,
		Now: spec.now, Lifetime: spec.lifetime, KeyType: spec.keyType,
	})
	require.NoError(t, err)
	return leaf
}

// ---- providers ----

// mutableProvider is an SNI certificate provider whose content tests change.
type mutableProvider struct {
	name string

	mu        sync.Mutex
	cert, key []byte
	names     []string
	listeners []dynamiccertificates.Listener
	reads     int // calls of CurrentCertKeyContent
}

var (
	_ dynamiccertificates.SNICertKeyContentProvider = &mutableProvider{}
	_ dynamiccertificates.Notifier                  = &mutableProvider{}
)

func newMutable(name string, iss *pki.Issued, names ...string) *mutableProvider {
	p := &mutableProvider{name: name, names: names}
	if iss != nil {
		p.cert, p.key = iss.CertPEM, iss.KeyPEM
	}
	return p
}

func (p *mutableProvider) Name() string { return p.name }

func (p *mutableProvider) CurrentCertKeyContent() ([]byte, []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads++
	return p.cert, p.key
}

// Reads returns how many times the content was read.
func (p *mutableProvider) Reads() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reads
}

// SetNames changes the explicit names and notifies the listeners.
func (p *mutableProvider) SetNames(names ...string) {
	p.mu.Lock()
	p.names = names
	ls := p.listeners
	p.mu.Unlock()
	for _, l := range ls {
		l.Enqueue()
	}
}

func (p *mutableProvider) SNINames() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.names
}

func (p *mutableProvider) AddListener(l dynamiccertificates.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listeners = append(p.listeners, l)
}

// Set changes the content and notifies the listeners, like a real provider.
func (p *mutableProvider) Set(cert, key []byte) {
	p.setQuietly(cert, key)
	p.mu.Lock()
	ls := p.listeners
	p.mu.Unlock()
	for _, l := range ls {
		l.Enqueue()
	}
}

func (p *mutableProvider) SetIssued(iss *pki.Issued) { p.Set(iss.CertPEM, iss.KeyPEM) }

func (p *mutableProvider) setQuietly(cert, key []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cert, p.key = cert, key
}

// mutableCA is a client CA provider whose bundle tests change.
type mutableCA struct {
	name string

	mu        sync.Mutex
	bundle    []byte
	listeners []dynamiccertificates.Listener
}

var _ dynamiccertificates.CAContentProvider = &mutableCA{}

func (p *mutableCA) Name() string { return p.name }

func (p *mutableCA) CurrentCABundleContent() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bundle
}

func (p *mutableCA) VerifyOptions() (x509.VerifyOptions, bool) {
	pool, _, err := pki.NewPool(p.CurrentCABundleContent())
	if err != nil {
		return x509.VerifyOptions{}, false
	}
	return x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, true
}

func (p *mutableCA) AddListener(l dynamiccertificates.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listeners = append(p.listeners, l)
}

func (p *mutableCA) Set(bundle []byte) {
	p.mu.Lock()
	p.bundle = bundle
	ls := p.listeners
	p.mu.Unlock()
	for _, l := range ls {
		l.Enqueue()
	}
}

// chanListener turns snapshot swaps into channel sends.
type chanListener chan struct{}

func (l chanListener) Enqueue() {
	select {
	case l <- struct{}{}:
	default:
	}
}

func waitFor(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// ---- TLS server and client on 127.0.0.1 ----

// testServer accepts TLS connections, completes the handshake, writes one
// byte (so the client also processes session tickets and any alert) and
// closes. Server-side handshake errors go to errs.
type testServer struct {
	addr string
	errs chan error
}

func startServer(t testing.TB, cfg *tls.Config) *testServer {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	s := &testServer{addr: ln.Addr().String(), errs: make(chan error, 64)}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // listener closed
			}
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				err := conn.(*tls.Conn).Handshake()
				if err == nil {
					_, err = conn.Write([]byte{'k'})
				}
				if err != nil {
					select {
					case s.errs <- err:
					default:
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return s
}

// dial handshakes with the server and reads its byte.
func dial(t testing.TB, addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	conn := tls.Client(raw, cfg)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := conn.Handshake(); err != nil {
		return tls.ConnectionState{}, err
	}
	if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
		return tls.ConnectionState{}, err
	}
	return conn.ConnectionState(), nil
}

// clientConfig returns a client config that accepts any server certificate,
// for tests that check which certificate was selected.
func clientConfig(clk clock.PassiveClock, serverName string) *tls.Config {
	return &tls.Config{
		ServerName:         serverName,
		InsecureSkipVerify: true, //nolint:gosec // selection tests inspect the peer certificate themselves
		Time:               clk.Now,
		MinVersion:         tls.VersionTLS12,
	}
}

// servedSerial dials and returns the serial of the leaf the server sent.
func servedSerial(t testing.TB, addr string, cfg *tls.Config) *big.Int {
	t.Helper()
	st, err := dial(t, addr, cfg)
	require.NoError(t, err)
	require.NotEmpty(t, st.PeerCertificates)
	return st.PeerCertificates[0].SerialNumber
}

func requireSerial(t testing.TB, want *pki.Issued, got *big.Int, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, want.Cert.SerialNumber.Text(16), got.Text(16), msgAndArgs...)
}

// ---- metrics ----

// metricValue reads a counter or gauge from the legacyregistry by name and
// provider label; 0 if the series does not exist.
func metricValue(t testing.TB, name, provider string) float64 {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "provider" && l.GetValue() == provider {
					if m.GetCounter() != nil {
						return m.GetCounter().GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

func loadErrors(t testing.TB, provider string) float64 {
	t.Helper()
	return metricValue(t, "evercert_certificate_load_errors_total", provider)
}

// parseCounter counts parses per provider through the controller's hook.
type parseCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func countParses(c *DynamicServingCertificateController) *parseCounter {
	pc := &parseCounter{n: map[string]int{}}
	c.onParse = func(name string) {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		pc.n[name]++
	}
	return pc
}

func (pc *parseCounter) get(name string) int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.n[name]
}

// fakeConn is a net.Conn that only has a local address, for GetCertificate
// tests without a socket.
type fakeConn struct {
	net.Conn
	local net.Addr
}

func (c fakeConn) LocalAddr() net.Addr { return c.local }

func x509Pool(t testing.TB, cas ...*pki.Issued) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	for _, ca := range cas {
		pool.AddCert(ca.Cert)
	}
	return pool
}

// newController returns the controller cfg configures, failing tb if cfg is
// invalid.
func newController(tb testing.TB, cfg ControllerConfig) *DynamicServingCertificateController {
	tb.Helper()
	c, err := NewDynamicServingCertificateController(cfg)
	require.NoError(tb, err)
	return c
}
