package sni

import (
	"crypto/tls"
	"testing"

	"github.com/evercert/evercert/internal/klogtest"
)

// BenchmarkDualCertificate measures serving an ECDSA and an RSA certificate
// for the same names (issue 14):
//
//   - select/*: GetCertificate alone, with hellos captured from real Go
//     clients: a name with one certificate, and a name (dual.test) with
//     both, for a client that takes ECDSA and for an RSA-only TLS 1.2
//     client;
//   - handshake/*: full handshakes over loopback TCP, client and server,
//     through the controller and through a static tls.Config holding both
//     certificates (crypto/tls then picks with SupportsCertificate too), for
//     a default Go client (TLS 1.3, gets ECDSA) and an RSA-only TLS 1.2
//     client. Session tickets are off, so every handshake is a full one.
//
// It measures, it does not assert.
func BenchmarkDualCertificate(b *testing.B) {
	klogtest.Discard(b)
	f := newDualAllocFixture(b)
	defaultClient := func(serverName string) *tls.Config {
		cfg := clientConfig(f.clk, serverName)
		cfg.SessionTicketsDisabled = true
		return cfg
	}
	rsaClient := func(serverName string) *tls.Config { return rsaOnlyTLS12(defaultClient(serverName)) }

	for _, tc := range []struct {
		name       string
		serverName string
		client     func(string) *tls.Config
	}{
		{"select/one/ecdsa-client", "single.test", defaultClient},
		{"select/two/ecdsa-client", "dual.test", defaultClient},
		{"select/two/rsa-client", "dual.test", rsaClient},
	} {
		hello := captureHello(b, tc.client(tc.serverName))
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				cert, err := f.c.GetCertificate(hello)
				if err != nil {
					b.Fatal(err)
				}
				benchSink = cert
			}
		})
	}

	static := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*f.ecdsa, *f.rsa}}
	for _, server := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"evercert", f.c.TLSConfig()},
		{"static", static},
	} {
		for _, client := range []struct {
			name string
			cfg  *tls.Config
		}{
			{"ecdsa-client", defaultClient("dual.test")},
			{"rsa-client", rsaClient("dual.test")},
		} {
			b.Run("handshake/"+server.name+"/"+client.name, func(b *testing.B) {
				benchHandshakes(b, server.cfg, client.cfg)
			})
		}
	}
}
