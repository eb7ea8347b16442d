package handshake

import (
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/evercert/evercert/internal/tlstest"
)

// Benchmarks here measure, they do not assert. Each runs five servers
// (startTargets): the example server; the same net/http server on
// evercert's server package, on upstream's controller and on a static
// config; and the example server's own code run from a copy of the binary
// the last three run from (example-app), which tells its code from its
// separately built binary. In every iteration it makes one connection to
// each of them in a random order, so that load from elsewhere on the
// machine falls on all five alike. ns/op is the five connections together.
//
// Metrics, per server NAME (evercert, library, upstream, static,
// example-app):
//   - NAME-hs/s: connections per second, each a new TCP connection, a
//     full TLS 1.3 handshake and the close (tlstest.Exchange), from the
//     client's clock;
//   - NAME-server-us/hs: the server process's CPU time per connection,
//     from /proc, over the whole loop (background work included, such as
//     the example server's once-a-second loopback self-check);
//   - evercert/static, evercert/upstream, library/static,
//     library/upstream, example-app/static and example-app/upstream: the
//     ratios of hs/s. library/upstream compares the two controllers alone:
//     same binary, same http.Server, same files.

// warmup connections per server before measuring: the first ones pay for
// lazy set-up (session ticket keys, HTTP/2 server, heap growth).
const warmup = 20

// BenchmarkServerHandshake: full TLS 1.3 handshakes (ECDSA P-256, no client
// certificate), the client offering h2 and http/1.1 as Go's HTTP client
// does.
func BenchmarkServerHandshake(b *testing.B) {
	c := loadCerts(b)
	f := writeFiles(b, c)
	targets := startTargets(b, f.servingArgs()...)
	cfg := clientConfig(c)
	measureInterleaved(b, targets, func(t *target) (tls.ConnectionState, error) {
		return tlstest.Exchange(t.addr, cfg)
	})
	reportHandshakes(b, targets)
}

// BenchmarkServerHandshakeMTLS: the same with a client certificate, which
// every server verifies against --client-ca-file (VerifyClientCertIfGiven,
// the example server's default with a client CA): evercert's snapshot
// holds a prepared pool, upstream's controller clones its config with the
// pool on every handshake.
func BenchmarkServerHandshakeMTLS(b *testing.B) {
	c := loadCerts(b)
	f := writeFiles(b, c)
	targets := startTargets(b, append(f.servingArgs(), "--client-ca-file="+f.clientCA)...)
	cfg := clientConfig(c)
	cfg.Certificates = []tls.Certificate{c.client}
	measureInterleaved(b, targets, func(t *target) (tls.ConnectionState, error) {
		return tlstest.Exchange(t.addr, cfg)
	})
	reportHandshakes(b, targets)
}

// BenchmarkServerResumption: TLS 1.3 resumption with session tickets
// across an unrelated certificate change. Every iteration rewrites the SNI
// certificate files (another certificate for sniName, which the client
// never asks for), waits until the example server and upstream present the
// new one, then makes one connection to each server with a client session
// cache holding the ticket of its previous connection. The static server
// never reloads: it is the baseline.
//
// Metrics: NAME-resumed is the fraction of connections that resumed
// (ConnectionState.DidResume); NAME-hs/s and the ratios are for these
// connections. Server CPU is not reported: it includes the polling.
func BenchmarkServerResumption(b *testing.B) {
	c := loadCerts(b)
	f := writeFiles(b, c)
	targets := startTargets(b, append(f.servingArgs(), "--tls-sni-cert-key="+f.sniCert+","+f.sniKey)...)
	clients := map[string]*tls.Config{}
	for _, t := range targets {
		cfg := clientConfig(c)
		cfg.SessionTicketsDisabled = false
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
		clients[t.name] = cfg
	}
	version := 0
	rotate := func() {
		version++
		next := c.sni[version%len(c.sni)]
		// The key first: the pair is mismatched until the certificate
		// follows, and both reloading servers reject it meanwhile.
		writeFile(b, f.sniKey, next.KeyPEM)
		writeFile(b, f.sniCert, next.CertPEM)
		want := next.Cert.SerialNumber.Text(16)
		for _, t := range targets {
			if t.name != kindStatic {
				if err := waitServed(t.addr, want); err != nil {
					b.Fatalf("%s: %v", t.name, err)
				}
			}
		}
	}
	measureInterleaved(b, targets, func(t *target) (tls.ConnectionState, error) {
		return tlstest.Exchange(t.addr, clients[t.name])
	}, rotate)
	for _, t := range targets {
		b.ReportMetric(float64(t.resumed)/float64(t.n), t.name+"-resumed")
	}
	reportRates(b, targets)
}

// clientConfig is a client that verifies the server's certificate, offers
// h2 and http/1.1, and makes full handshakes only.
func clientConfig(c *certs) *tls.Config {
	return &tls.Config{
		ServerName:             servingName,
		RootCAs:                c.roots,
		MinVersion:             tls.VersionTLS13,
		NextProtos:             []string{"h2", "http/1.1"},
		SessionTicketsDisabled: true,
	}
}

// waitServed handshakes with addr for sniName until it presents the
// certificate with serial want; polling is bounded.
func waitServed(addr, want string) error {
	cfg := &tls.Config{ServerName: sniName, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} //nolint:gosec // only the serial is checked
	deadline := time.Now().Add(10 * time.Second)
	for {
		cert, err := tlstest.Dial(addr, cfg)
		if err == nil && cert.SerialNumber.Text(16) == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not present SNI certificate %s within 10s (last error: %v)", addr, want, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// measureInterleaved runs op on every target once per b.Loop iteration, in
// a random order, after warmup connections to each. The order is random,
// not rotating, because a server's work does not end with the client's
// handshake (it verifies the client's Finished, sends a ticket, closes), and
// a fixed neighbour would always overlap it; before each iteration it calls every between func
// (untimed for the targets, but inside b.Loop's time). It totals each
// target's connections and wall time, and its server CPU time over the
// loop, and how many of its connections resumed a session.
func measureInterleaved(b *testing.B, targets []*target, op func(*target) (tls.ConnectionState, error), between ...func()) {
	for _, t := range targets {
		for range warmup {
			if _, err := op(t); err != nil {
				b.Fatalf("%s: %v", t.name, err)
			}
		}
	}
	cpu0 := make([]time.Duration, len(targets))
	for i, t := range targets {
		var err error
		if cpu0[i], err = processCPU(t.pid); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		for _, fn := range between {
			fn()
		}
		for _, k := range rand.Perm(len(targets)) {
			t := targets[k]
			start := time.Now()
			st, err := op(t)
			if err != nil {
				b.Fatalf("%s: %v", t.name, err)
			}
			t.wall += time.Since(start)
			t.n++
			if st.DidResume {
				t.resumed++
			}
		}
	}
	for i, t := range targets {
		cpu, err := processCPU(t.pid)
		if err != nil {
			b.Fatal(err)
		}
		t.cpu = cpu - cpu0[i]
	}
}

// reportHandshakes reports the rates, the ratios and the server CPU time
// per connection.
func reportHandshakes(b *testing.B, targets []*target) {
	reportRates(b, targets)
	for _, t := range targets {
		b.ReportMetric(float64(t.cpu.Microseconds())/float64(t.n), t.name+"-server-us/hs")
	}
}

func reportRates(b *testing.B, targets []*target) {
	rate := map[string]float64{}
	for _, t := range targets {
		rate[t.name] = float64(t.n) / t.wall.Seconds()
		b.ReportMetric(rate[t.name], t.name+"-hs/s")
	}
	b.ReportMetric(rate["evercert"]/rate[kindStatic], "evercert/static")
	b.ReportMetric(rate["evercert"]/rate[kindUpstream], "evercert/upstream")
	b.ReportMetric(rate[kindLibrary]/rate[kindStatic], "library/static")
	b.ReportMetric(rate[kindLibrary]/rate[kindUpstream], "library/upstream")
	b.ReportMetric(rate[kindExampleApp]/rate[kindStatic], "example-app/static")
	b.ReportMetric(rate[kindExampleApp]/rate[kindUpstream], "example-app/upstream")
}
