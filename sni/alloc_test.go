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
