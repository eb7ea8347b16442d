//go:build !race

// The race detector allocates, so this file is left out of -race builds
// instead of skipping at run time; `make test` runs it in its own step
// without -race (make test-alloc), so the promise is checked in CI.

package sni

import (
	"crypto/tls"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLookupDoesNotAllocate asserts the hot path's zero-allocation promise
// for every lookup kind.
func TestLookupDoesNotAllocate(t *testing.T) {
	f := newSelectionFixture(t)
	local := fakeConn{local: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443}}
	for _, hello := range []*tls.ClientHelloInfo{
		{ServerName: "exact.example.com"},
		{ServerName: "a.wild.example.com"},
		{ServerName: "a.b.wild.example.com"},
		{ServerName: "nomatch.test"},
		{Conn: local},
		{},
	} {
		allocs := testing.AllocsPerRun(200, func() {
			cfg, err := f.c.GetConfigForClient(hello)
			if err != nil {
				panic(err)
			}
			if _, err := cfg.GetCertificate(hello); err != nil {
				panic(err)
			}
		})
		assert.Zero(t, allocs, "GetConfigForClient + GetCertificate, server name %q", hello.ServerName)
		// The hook frameworks set on their own config (see GetCertificate).
		allocs = testing.AllocsPerRun(200, func() {
			if _, err := f.c.GetCertificate(hello); err != nil {
				panic(err)
			}
		})
		assert.Zero(t, allocs, "controller GetCertificate, server name %q", hello.ServerName)
	}
}

// TestDualLookupAllocations measures selection in a snapshot where one
// name and the default have an ECDSA and an RSA certificate, with hellos
// captured from real Go clients. A name with one certificate still costs
// nothing. With two, the only allocations are crypto/tls's own inside
// SupportsCertificate (Go 1.26: 2 for a client that takes the ECDSA
// certificate, 10 for an RSA-only TLS 1.2 client, which is asked about
// both): the selection adds none of its own.
func TestDualLookupAllocations(t *testing.T) {
	f := newDualAllocFixture(t)
	for _, tc := range []struct {
		name, serverName string
		client           func(*tls.Config) *tls.Config
		asked            []*tls.Certificate // what SupportsCertificate is asked about
	}{
		{"one certificate", "single.test", func(c *tls.Config) *tls.Config { return c }, nil},
		{"one certificate, RSA-only client", "single.test", rsaOnlyTLS12, nil},
		{"two, ECDSA client", "dual.test", func(c *tls.Config) *tls.Config { return c }, []*tls.Certificate{f.ecdsa}},
		{"two, RSA-only client", "dual.test", rsaOnlyTLS12, []*tls.Certificate{f.ecdsa, f.rsa}},
		{"default, ECDSA client", "", func(c *tls.Config) *tls.Config { return c }, []*tls.Certificate{f.ecdsa}},
		{"default, RSA-only client", "", rsaOnlyTLS12, []*tls.Certificate{f.ecdsa, f.rsa}},
	} {
		hello := captureHello(t, tc.client(clientConfig(f.clk, tc.serverName)))
		probe := *hello
		probe.ServerName = ""
		inTLS := testing.AllocsPerRun(200, func() {
			for _, cert := range tc.asked {
				_ = probe.SupportsCertificate(cert)
			}
		})
		allocs := testing.AllocsPerRun(200, func() {
			if _, err := f.c.GetCertificate(hello); err != nil {
				panic(err)
			}
		})
		t.Logf("%s: %v allocations (crypto/tls SupportsCertificate: %v)", tc.name, allocs, inTLS)
		assert.Equal(t, inTLS, allocs, "%s: selection allocates beyond SupportsCertificate", tc.name)
		if tc.asked == nil {
			assert.Zero(t, allocs, "%s: a single certificate must cost nothing", tc.name)
		}
	}
}
