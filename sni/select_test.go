package sni

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// selectionFixture is a controller with one certificate per selection rule.
type selectionFixture struct {
	clk  *clocktesting.FakeClock
	ca   *pki.Issued
	c    *DynamicServingCertificateController
	srv  *testServer
	cert map[string]*pki.Issued
}

func newSelectionFixture(t *testing.T) *selectionFixture {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "selection-ca")
	leaf := func(cn string, dns ...string) *pki.Issued {
		return issueLeaf(t, ca, leafSpec{cn: cn, dns: dns, now: clk.Now()})
	}
	f := &selectionFixture{clk: clk, ca: ca, cert: map[string]*pki.Issued{
		"serving":  leaf("default.test", "default.test"),
		"exact":    leaf("exact.example.com", "conflict.test"),
		"wild":     leaf("wild_card", "*.wild.example.com"),
		"conflict": leaf("conflict_loser", "conflict.test", "other.test"),
		"explicit": leaf("replaced.test", "replaced.test"),
		"exp1":     leaf("exp1", "exp1.test"),
		"exp2":     leaf("exp2", "exp2.test"),
		"extr":     leaf("extracted_cert", "explicit-beats.test"),
		"expl":     leaf("explicit-winner", "unrelated.test"),
	}}
	// An upstream provider, to show they are accepted as they are.
	upstreamExplicit, err := dynamiccertificates.NewStaticSNICertKeyContent("explicit",
		f.cert["explicit"].CertPEM, f.cert["explicit"].KeyPEM, "Explicit.test", "127.0.0.1")
	require.NoError(t, err)
	sniCerts := []dynamiccertificates.SNICertKeyContentProvider{
		newMutable("exact", f.cert["exact"]),
		newMutable("wild", f.cert["wild"]),
		newMutable("conflict", f.cert["conflict"]),
		upstreamExplicit,
		newMutable("exp1", f.cert["exp1"], "conflict2.test"),
		newMutable("exp2", f.cert["exp2"], "conflict2.test"),
		newMutable("extr", f.cert["extr"]),
		newMutable("expl", f.cert["expl"], "explicit-beats.test"),
	}
	f.c = newController(t, ControllerConfig{Serving: newMutable("serving", f.cert["serving"]), SNI: sniCerts, Clock: clk})
	require.NoError(t, f.c.RunOnce(context.Background()))
	f.srv = startServer(t, f.c.TLSConfig())
	return f
}

func TestSNISelection(t *testing.T) {
	f := newSelectionFixture(t)
	tests := []struct {
		name       string
		serverName string
		want       string
	}{
		{"exact match", "exact.example.com", "exact"},
		{"exact match ignores case", "EXACT.Example.COM", "exact"},
		{"wildcard single label", "a.wild.example.com", "wild"},
		{"wildcard single label, upper case", "B.WILD.example.com", "wild"},
		{"wildcard does not match two labels", "a.b.wild.example.com", "serving"},
		{"wildcard does not match the bare suffix", "wild.example.com", "serving"},
		{"explicit names replace extracted names", "replaced.test", "serving"},
		{"explicit name, lower-cased", "explicit.test", "explicit"},
		{"conflict between extracted names: earlier wins", "conflict.test", "exact"},
		{"loser still serves its other names", "other.test", "conflict"},
		{"conflict between explicit names: earlier wins", "conflict2.test", "exp1"},
		{"explicit name beats an earlier extracted name", "explicit-beats.test", "expl"},
		{"CN that is not a DNS name is not indexed", "wild_card", "serving"},
		{"CN that is a DNS name is indexed", "exact.example.com", "exact"},
		{"no match falls back to the serving certificate", "nomatch.test", "serving"},
		{"no SNI: explicit local IP", "", "explicit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := servedSerial(t, f.srv.addr, clientConfig(f.clk, tt.serverName))
			requireSerial(t, f.cert[tt.want], got, "server name %q", tt.serverName)
		})
	}
}

// TestSNISelectionVerifies checks a client that verifies the chain and host
// name accepts what is served, so the selected chain is complete.
func TestSNISelectionVerifies(t *testing.T) {
	f := newSelectionFixture(t)
	roots := x509Pool(t, f.ca)
	for _, name := range []string{"conflict.test", "x.wild.example.com", "default.test", "other.test"} {
		cfg := &tls.Config{ServerName: name, RootCAs: roots, Time: f.clk.Now, MinVersion: tls.VersionTLS13}
		_, err := dial(t, f.srv.addr, cfg)
		require.NoError(t, err, name)
	}
}

func TestIPSANIsNotIndexedWithoutExplicitName(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	serving := issueLeaf(t, ca, leafSpec{cn: "default.test", now: clk.Now()})
	withIP := issueLeaf(t, ca, leafSpec{cn: "127.0.0.1", ips: []net.IP{net.IPv4(127, 0, 0, 1)}, now: clk.Now()})
	c := newController(t, ControllerConfig{
		Serving: newMutable("serving", serving),
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{newMutable("ip-san", withIP)},
		Clock:   clk,
	})
	require.NoError(t, c.RunOnce(context.Background()))
	srv := startServer(t, c.TLSConfig())

	requireSerial(t, serving, servedSerial(t, srv.addr, clientConfig(clk, "")))
	for _, s := range c.Served() {
		if s.Provider == "ip-san" {
			assert.Empty(t, s.Names, "neither an IP CN nor an IP SAN is an SNI name")
		}
	}
}

func TestDefaultWithoutServingCertIsDeterministic(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	var certs []*pki.Issued
	for _, cn := range []string{"a.test", "b.test", "c.test"} {
		certs = append(certs, issueLeaf(t, ca, leafSpec{cn: cn, dns: []string{cn}, now: clk.Now()}))
	}
	for _, firstValid := range []bool{true, false} {
		want := certs[0]
		if !firstValid {
			want = certs[1]
		}
		for i := range 5 {
			first := newMutable("a", certs[0])
			if !firstValid {
				first = newMutable("a-invalid", nil)
				first.setQuietly([]byte("garbage"), []byte("garbage"))
			}
			c := newController(t, ControllerConfig{
				SNI: []dynamiccertificates.SNICertKeyContentProvider{
					first, newMutable("b", certs[1]), newMutable("c", certs[2]),
				},
				Clock: clk,
			})
			require.NoError(t, c.RunOnce(context.Background()))
			srv := startServer(t, c.TLSConfig())
			requireSerial(t, want, servedSerial(t, srv.addr, clientConfig(clk, "nomatch.test")), "run %d, first valid %v", i, firstValid)
			requireSerial(t, want, servedSerial(t, srv.addr, clientConfig(clk, "")), "run %d, no SNI", i)
			// The other names still select their own certificates.
			requireSerial(t, certs[2], servedSerial(t, srv.addr, clientConfig(clk, "c.test")))

			var defaults []string
			for _, s := range c.Served() {
				if s.IsDefault {
					defaults = append(defaults, s.Serial)
				}
			}
			require.Equal(t, []string{want.Cert.SerialNumber.Text(16)}, defaults)
		}
	}
}

func TestNotReadyBeforeFirstSync(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	p := newMutable("serving", issueLeaf(t, ca, leafSpec{cn: "default.test", now: clk.Now()}))
	c := newController(t, ControllerConfig{Serving: p, Clock: clk})

	cfg, err := c.GetConfigForClient(&tls.ClientHelloInfo{ServerName: "default.test"})
	require.ErrorIs(t, err, ErrNotReady)
	require.Nil(t, cfg)
	require.False(t, c.HasSynced())
	require.Nil(t, c.Served())

	srv := startServer(t, c.TLSConfig())
	_, err = dial(t, srv.addr, clientConfig(clk, "default.test"))
	require.Error(t, err, "handshake must fail before the first sync")
	select {
	case serr := <-srv.errs:
		require.ErrorIs(t, serr, ErrNotReady)
	case <-time.After(10 * time.Second):
		t.Fatal("no server-side handshake error")
	}

	require.NoError(t, c.RunOnce(context.Background()))
	require.True(t, c.HasSynced())
	_, err = dial(t, srv.addr, clientConfig(clk, "default.test"))
	require.NoError(t, err)
}

func TestRunOnceFailsWithNothingValid(t *testing.T) {
	bad := newMutable("only-bad", nil)
	bad.setQuietly([]byte("not pem"), []byte("not pem"))
	c := newController(t, ControllerConfig{Serving: bad})
	err := c.RunOnce(context.Background())
	require.ErrorIs(t, err, errNothingLoaded)
	require.ErrorContains(t, err, `"only-bad"`, "the error names the provider")
	require.False(t, c.HasSynced())
	// A config with no provider at all is refused at construction
	// (TestControllerConfigErrorsNameTheField).
}

func TestGetCertificateLocalIP(t *testing.T) {
	f := newSelectionFixture(t)
	cfg, err := f.c.GetConfigForClient(&tls.ClientHelloInfo{})
	require.NoError(t, err)
	tests := []struct {
		name  string
		local net.Addr
		want  string
	}{
		{"IPv4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, "explicit"},
		{"IPv4 as 16 bytes", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1).To16()}, "explicit"},
		{"UDP (QUIC)", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, "explicit"},
		{"other IP", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, "serving"},
		{"not an IP address", &net.UnixAddr{Name: "/sock", Net: "unix"}, "serving"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert, err := cfg.GetCertificate(&tls.ClientHelloInfo{Conn: fakeConn{local: tt.local}})
			require.NoError(t, err)
			require.Equal(t, f.cert[tt.want].Cert.SerialNumber, cert.Leaf.SerialNumber)
		})
	}
	cert, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
	require.NoError(t, err)
	require.Equal(t, f.cert["serving"].Cert.SerialNumber, cert.Leaf.SerialNumber, "nil Conn")
}

func TestServed(t *testing.T) {
	f := newSelectionFixture(t)
	served := f.c.Served()
	byProvider := map[string]ServedCertificate{}
	var order []string
	for _, s := range served {
		byProvider[s.Provider] = s
		order = append(order, s.Provider)
	}
	require.Equal(t, []string{"serving", "exact", "wild", "conflict", "explicit", "exp1", "exp2", "extr", "expl"}, order)

	s := byProvider["serving"]
	assert.Equal(t, RoleServing, s.Role)
	assert.True(t, s.IsDefault)
	assert.Equal(t, "default.test", s.Subject)
	assert.Equal(t, f.cert["serving"].Cert.SerialNumber.Text(16), s.Serial)
	assert.Equal(t, f.cert["serving"].Cert.NotAfter, s.NotAfter)
	assert.Equal(t, f.cert["serving"].Cert.NotBefore, s.NotBefore)

	assert.Equal(t, RoleSNI, byProvider["exact"].Role)
	assert.False(t, byProvider["exact"].IsDefault)
	assert.Equal(t, []string{"exact.example.com", "conflict.test"}, byProvider["exact"].Names)
	assert.Equal(t, []string{"other.test"}, byProvider["conflict"].Names)
	assert.Equal(t, []string{"*.wild.example.com"}, byProvider["wild"].Names)
	assert.Equal(t, []string{"explicit.test", "127.0.0.1"}, byProvider["explicit"].Names)
	assert.Equal(t, []string{"conflict2.test"}, byProvider["exp1"].Names)
	assert.Empty(t, byProvider["exp2"].Names)
	assert.Empty(t, byProvider["extr"].Names)
	assert.Equal(t, []string{"explicit-beats.test"}, byProvider["expl"].Names)

	// A copy: changing it does not change the controller's view.
	served[1].Names[0] = "mutated"
	served[0].Provider = "mutated"
	again := f.c.Served()
	assert.Equal(t, "exact.example.com", again[1].Names[0])
	assert.Equal(t, "serving", again[0].Provider)
}
