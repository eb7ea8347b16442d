package sni

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/pki"
)

// Benchmarks compare evercert's controller with upstream's and with a
// static tls.Config. They measure, they do not assert.

var benchSink any

// benchFixture holds certificates generated once per process.
type benchFixture struct {
	ca      *pki.Issued
	serving map[pki.KeyType]*pki.Issued
	sni     []*pki.Issued // 10,000 ECDSA leaves: host-<i>.example.test
	sniAlt  *pki.Issued   // a second certificate for host-0, for rebuilds
}

var (
	benchOnce sync.Once
	bench     benchFixture
)

const maxSNI = 10000

func benchCerts(b *testing.B) *benchFixture {
	b.Helper()
	benchOnce.Do(func() {
		// Parse errors and loads are logged; keep benchmark output readable.
		klog.LogToStderr(false)
		now := time.Now()
		bench.ca = newTestCA(b, now, "bench-ca")
		bench.serving = map[pki.KeyType]*pki.Issued{}
		for _, kt := range []pki.KeyType{pki.ECDSAP256, pki.RSA2048} {
			bench.serving[kt] = issueLeaf(b, bench.ca, leafSpec{cn: "default.test", dns: []string{"default.test"}, now: now, keyType: kt})
		}
		bench.sni = make([]*pki.Issued, maxSNI)
		for i := range bench.sni {
			name := fmt.Sprintf("host-%d.example.test", i)
			bench.sni[i] = issueLeaf(b, bench.ca, leafSpec{cn: name, dns: []string{name}, now: now})
		}
		bench.sniAlt = issueLeaf(b, bench.ca, leafSpec{cn: "host-0.example.test", dns: []string{"host-0.example.test"}, now: now})
	})
	return &bench
}

func staticSNI(b *testing.B, iss *pki.Issued, name string) dynamiccertificates.SNICertKeyContentProvider {
	b.Helper()
	p, err := dynamiccertificates.NewStaticSNICertKeyContent(name, iss.CertPEM, iss.KeyPEM)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkGetConfigForClient measures the per-handshake config hook alone,
// with one serving and three SNI certificates, and SNI set.
func BenchmarkGetConfigForClient(b *testing.B) {
	f := benchCerts(b)
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	servingIss := f.serving[pki.ECDSAP256]
	serving, err := dynamiccertificates.NewStaticCertKeyContent("serving", servingIss.CertPEM, servingIss.KeyPEM)
	if err != nil {
		b.Fatal(err)
	}
	var sniCerts []dynamiccertificates.SNICertKeyContentProvider
	for i := range 3 {
		sniCerts = append(sniCerts, staticSNI(b, f.sni[i], fmt.Sprintf("sni-%d", i)))
	}
	hello := &tls.ClientHelloInfo{ServerName: "host-1.example.test"}

	b.Run("evercert", func(b *testing.B) {
		c := newController(b, ControllerConfig{Base: base, Serving: serving, SNI: sniCerts})
		if err := c.RunOnce(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			cfg, err := c.GetConfigForClient(hello)
			if err != nil {
				b.Fatal(err)
			}
			benchSink = cfg
		}
	})
	b.Run("upstream", func(b *testing.B) {
		c := dynamiccertificates.NewDynamicServingCertificateController(base, nil, serving, sniCerts, nil)
		if err := c.RunOnce(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			cfg, err := c.GetConfigForClient(hello)
			if err != nil {
				b.Fatal(err)
			}
			benchSink = cfg
		}
	})
	b.Run("static", func(b *testing.B) {
		static := base.Clone()
		static.Certificates = []tls.Certificate{servingIssPair(b, servingIss)}
		get := func(*tls.ClientHelloInfo) (*tls.Config, error) { return static, nil }
		b.ReportAllocs()
		for b.Loop() {
			cfg, err := get(hello)
			if err != nil {
				b.Fatal(err)
			}
			benchSink = cfg
		}
	})
}

func servingIssPair(b *testing.B, iss *pki.Issued) tls.Certificate {
	b.Helper()
	pair, err := tls.X509KeyPair(iss.CertPEM, iss.KeyPEM)
	if err != nil {
		b.Fatal(err)
	}
	return pair
}

// BenchmarkHandshake measures full TLS 1.3 handshakes over loopback TCP
// (connect included), client and server, through the controller and through
// a static config serving the same certificate. The client disables session
// tickets, so every handshake is a full one.
func BenchmarkHandshake(b *testing.B) {
	f := benchCerts(b)
	for _, kt := range []pki.KeyType{pki.ECDSAP256, pki.RSA2048} {
		iss := f.serving[kt]
		evercert := newController(b, ControllerConfig{
			Base:    &tls.Config{MinVersion: tls.VersionTLS12},
			Serving: staticCertKey(b, iss),
			SNI:     []dynamiccertificates.SNICertKeyContentProvider{staticSNI(b, f.sni[0], "sni-0")},
		})
		if err := evercert.RunOnce(context.Background()); err != nil {
			b.Fatal(err)
		}
		static := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{servingIssPair(b, iss)}}
		for _, tc := range []struct {
			name string
			cfg  *tls.Config
		}{
			{"evercert", evercert.TLSConfig()},
			{"static", static},
		} {
			b.Run(tc.name+"/"+string(kt), func(b *testing.B) {
				benchHandshakes(b, tc.cfg, f)
			})
		}
	}
}

func staticCertKey(b *testing.B, iss *pki.Issued) dynamiccertificates.CertKeyContentProvider {
	b.Helper()
	p, err := dynamiccertificates.NewStaticCertKeyContent("serving", iss.CertPEM, iss.KeyPEM)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func benchHandshakes(b *testing.B, serverCfg *tls.Config, f *benchFixture) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	results := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			conn := tls.Server(raw, serverCfg)
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			err = conn.Handshake()
			conn.Close()
			results <- err
		}
	})
	defer func() {
		ln.Close()
		wg.Wait()
	}()
	clientCfg := &tls.Config{
		ServerName:             "default.test",
		RootCAs:                x509Pool(b, f.ca),
		MinVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
	}
	addr := ln.Addr().String()
	b.ReportAllocs()
	for b.Loop() {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		conn := tls.Client(raw, clientCfg)
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if err := conn.Handshake(); err != nil {
			b.Fatal(err)
		}
		if err := <-results; err != nil {
			b.Fatal(err)
		}
		conn.Close()
	}
}

// scaleControllers caches one controller per size across sub-benchmarks;
// priming the 10,000-certificate one parses 10,000 certificates.
var scaleControllers = map[int]*scaleController{}

type scaleController struct {
	c         *DynamicServingCertificateController
	providers []*mutableProvider
}

func scaleFor(b *testing.B, n int) *scaleController {
	b.Helper()
	if sc, ok := scaleControllers[n]; ok {
		return sc
	}
	f := benchCerts(b)
	sc := &scaleController{}
	sniCerts := make([]dynamiccertificates.SNICertKeyContentProvider, n)
	for i := range n {
		p := newMutable(fmt.Sprintf("sni-%d", i), f.sni[i])
		sc.providers = append(sc.providers, p)
		sniCerts[i] = p
	}
	sc.c = newController(b, ControllerConfig{Serving: staticCertKey(b, f.serving[pki.ECDSAP256]), SNI: sniCerts})
	if err := sc.c.RunOnce(context.Background()); err != nil {
		b.Fatal(err)
	}
	scaleControllers[n] = sc
	return sc
}

// BenchmarkSNIScale measures certificate selection (GetConfigForClient plus
// GetCertificate) with 1, 100 and 10,000 SNI certificates, cycling through
// all names; and the cost of the rebuild after one of 10,000 providers
// changed, which parses only that provider.
func BenchmarkSNIScale(b *testing.B) {
	for _, n := range []int{1, 100, maxSNI} {
		b.Run(fmt.Sprintf("select/n=%d", n), func(b *testing.B) {
			sc := scaleFor(b, n)
			hellos := make([]*tls.ClientHelloInfo, n)
			for i := range hellos {
				hellos[i] = &tls.ClientHelloInfo{ServerName: fmt.Sprintf("host-%d.example.test", i)}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				hello := hellos[i%n]
				i++
				cfg, err := sc.c.GetConfigForClient(hello)
				if err != nil {
					b.Fatal(err)
				}
				cert, err := cfg.GetCertificate(hello)
				if err != nil {
					b.Fatal(err)
				}
				benchSink = cert
			}
		})
	}
	b.Run(fmt.Sprintf("rebuild-one-changed/n=%d", maxSNI), func(b *testing.B) {
		f := benchCerts(b)
		sc := scaleFor(b, maxSNI)
		contents := []*pki.Issued{f.sniAlt, f.sni[0]}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			next := contents[i%2]
			i++
			// Quietly: the queue is not running; sync is called directly.
			sc.providers[0].setQuietly(next.CertPEM, next.KeyPEM)
			if _, err := sc.c.sync(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
