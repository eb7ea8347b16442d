package sni

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/klogtest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// Benchmarks compare evercert's controller with upstream's and with a
// static tls.Config. They measure, they do not assert.

var benchSink any

// benchFixture holds certificates generated once per process.
type benchFixture struct {
	ca      *pki.Issued
	serving map[pki.KeyType]*pki.Issued
	// sni are ECDSA P-256 leaves for host-<i>.example.test, made on demand
	// by sniLeaves and kept as PEM only (a parsed certificate per leaf
	// would cost the process hundreds of MB at 100,000). They share one key,
	// because generating 100,000 keys takes longer than signing: the
	// controller still parses each provider's key PEM into a key of its
	// own, so what it holds per certificate is what distinct keys cost.
	sni    []*pki.Issued
	sniKey crypto.Signer
	sniAlt *pki.Issued // a second certificate for host-0, for rebuilds
}

var (
	benchOnce sync.Once
	bench     benchFixture
	sniMu     sync.Mutex
)

// maxSNI is the largest number of SNI certificates benchmarked.
const maxSNI = 100000

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
		key, err := pki.GenerateKey(pki.ECDSAP256)
		if err != nil {
			b.Fatal(err)
		}
		bench.sniKey = key
		bench.sniAlt = issueLeaf(b, bench.ca, leafSpec{cn: "host-0.example.test", dns: []string{"host-0.example.test"}, now: now})
	})
	return &bench
}

// sniLeaves returns the first n SNI leaves, issuing the missing ones on all
// CPUs.
func (f *benchFixture) sniLeaves(b *testing.B, n int) []*pki.Issued {
	b.Helper()
	sniMu.Lock()
	defer sniMu.Unlock()
	if len(f.sni) >= n {
		return f.sni[:n]
	}
	start := len(f.sni)
	f.sni = append(f.sni, make([]*pki.Issued, n-start)...)
	now := time.Now()
	workers := runtime.GOMAXPROCS(0)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var keyPEM []byte
			for i := start + w; i < n; i += workers {
				name := fmt.Sprintf("host-%d.example.test", i)
				leaf, err := pki.IssueLeaf(f.ca, pki.Request{CommonName: name, DNSNames: []string{name}, Now: now, Lifetime: 12 * time.Hour, Key: f.sniKey})
				if err != nil {
					errs[w] = err
					return
				}
				if keyPEM == nil {
					keyPEM = leaf.KeyPEM
				}
				f.sni[i] = &pki.Issued{CertPEM: leaf.CertPEM, KeyPEM: keyPEM}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		f.sni = f.sni[:start]
		b.Fatal(err)
	}
	return f.sni[:n]
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
	klogtest.Discard(b)
	f := benchCerts(b)
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	servingIss := f.serving[pki.ECDSAP256]
	serving, err := dynamiccertificates.NewStaticCertKeyContent("serving", servingIss.CertPEM, servingIss.KeyPEM)
	if err != nil {
		b.Fatal(err)
	}
	var sniCerts []dynamiccertificates.SNICertKeyContentProvider
	for i, leaf := range f.sniLeaves(b, 3) {
		sniCerts = append(sniCerts, staticSNI(b, leaf, fmt.Sprintf("sni-%d", i)))
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
	klogtest.Discard(b)
	f := benchCerts(b)
	for _, kt := range []pki.KeyType{pki.ECDSAP256, pki.RSA2048} {
		iss := f.serving[kt]
		evercert := newController(b, ControllerConfig{
			Base:    &tls.Config{MinVersion: tls.VersionTLS12},
			Serving: staticCertKey(b, iss),
			SNI:     []dynamiccertificates.SNICertKeyContentProvider{staticSNI(b, f.sniLeaves(b, 1)[0], "sni-0")},
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
				benchHandshakes(b, tc.cfg, &tls.Config{
					ServerName:             "default.test",
					RootCAs:                x509Pool(b, f.ca),
					MinVersion:             tls.VersionTLS13,
					SessionTicketsDisabled: true,
				})
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

// benchHandshakes runs full handshakes of clientCfg against a server with
// serverCfg on 127.0.0.1, one connection each.
func benchHandshakes(b *testing.B, serverCfg, clientCfg *tls.Config) {
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

// scaleControllers caches one controller per size across sub-benchmarks and
// -count runs; priming the 100,000-certificate one parses 100,000
// certificates.
var scaleControllers = map[int]*scaleController{}

type scaleController struct {
	c         *DynamicServingCertificateController
	providers []*mutableProvider
}

// scaleProviders returns n SNI providers named prefix-<i> serving the first
// n fixture leaves, as the controller's argument and as the mutable
// providers themselves.
func scaleProviders(b *testing.B, n int, prefix string) ([]dynamiccertificates.SNICertKeyContentProvider, []*mutableProvider) {
	b.Helper()
	leaves := benchCerts(b).sniLeaves(b, n)
	sniCerts := make([]dynamiccertificates.SNICertKeyContentProvider, n)
	providers := make([]*mutableProvider, n)
	for i, leaf := range leaves {
		providers[i] = newMutable(fmt.Sprintf("%s-%d", prefix, i), leaf)
		sniCerts[i] = providers[i]
	}
	return sniCerts, providers
}

func scaleFor(b *testing.B, n int) *scaleController {
	b.Helper()
	if sc, ok := scaleControllers[n]; ok {
		return sc
	}
	f := benchCerts(b)
	sc := &scaleController{}
	var sniCerts []dynamiccertificates.SNICertKeyContentProvider
	sniCerts, sc.providers = scaleProviders(b, n, "sni")
	sc.c = newController(b, ControllerConfig{Serving: staticCertKey(b, f.serving[pki.ECDSAP256]), SNI: sniCerts})
	if err := sc.c.RunOnce(context.Background()); err != nil {
		b.Fatal(err)
	}
	scaleControllers[n] = sc
	return sc
}

// BenchmarkSNIScale measures, with 1 to 100,000 SNI certificates (one
// provider each, one name each):
//
//   - select/n=N: certificate selection (GetConfigForClient plus
//     GetCertificate), cycling through all names;
//   - rebuild-one-changed/n=N: one provider's certificate changes (same
//     names) and it notifies; the queued sync reads and parses that
//     provider alone, and derives the new snapshot from the previous one;
//   - rebuild-one-changed-upstream/n=10000: the same change through
//     upstream's controller (RunOnce), which re-parses every certificate;
//   - startup/n=100000: a new controller on 100,000 providers (their
//     metrics reported together, the default above
//     DefaultPerProviderMetricsLimit), from its
//     construction and Run to the first successful TLS handshake on
//     127.0.0.1 (ms-to-first-handshake), and the heap it holds per
//     certificate then (B/cert: runtime.MemStats.HeapAlloc after a GC,
//     before construction and after the first handshake; parsed
//     certificates and keys, the name index, the served descriptions and
//     the metric series; the PEM the providers hold is not counted). The
//     providers are read and parsed on GOMAXPROCS goroutines;
//   - startup-per-provider-metrics/n=100000: the same with three metric
//     series per provider (PerProviderMetricsLimit 200,000).
func BenchmarkSNIScale(b *testing.B) {
	klogtest.Discard(b)
	for _, n := range []int{1, 100, 10000, maxSNI} {
		b.Run(fmt.Sprintf("select/n=%d", n), func(b *testing.B) {
			sc := scaleFor(b, n)
			hellos := make([]*tls.ClientHelloInfo, n)
			for i := range hellos {
				hellos[i] = &tls.ClientHelloInfo{ServerName: fmt.Sprintf("host-%d.example.test", i)}
			}
			// Not the garbage of making and parsing the certificates: a
			// GC marking it would slow the loop down.
			runtime.GC()
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
	for _, n := range []int{10000, maxSNI} {
		b.Run(fmt.Sprintf("rebuild-one-changed/n=%d", n), func(b *testing.B) {
			f := benchCerts(b)
			sc := scaleFor(b, n)
			contents := []*pki.Issued{f.sniAlt, f.sniLeaves(b, 1)[0]}
			runtime.GC() // as in select
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				next := contents[i%2]
				i++
				// The provider notifies, and the worker's step of Run
				// processes the queued sync (Run itself can be started
				// only once, and sc is shared by every run).
				sc.providers[0].Set(next.CertPEM, next.KeyPEM)
				sc.c.processNextWorkItem(klog.Background())
			}
			// The last change is served.
			want, _ := pem.Decode(contents[(i-1)%2].CertPEM)
			cert, err := sc.c.GetCertificate(&tls.ClientHelloInfo{ServerName: "host-0.example.test"})
			if err != nil || want == nil || !bytes.Equal(cert.Certificate[0], want.Bytes) {
				b.Fatalf("host-0 does not serve the last certificate set (%v)", err)
			}
		})
	}
	b.Run("rebuild-one-changed-upstream/n=10000", func(b *testing.B) {
		f := benchCerts(b)
		sniCerts, providers := scaleProviders(b, 10000, "upstream-sni")
		c := dynamiccertificates.NewDynamicServingCertificateController(&tls.Config{MinVersion: tls.VersionTLS12}, nil,
			staticCertKey(b, f.serving[pki.ECDSAP256]), sniCerts, nil)
		if err := c.RunOnce(); err != nil {
			b.Fatal(err)
		}
		contents := []*pki.Issued{f.sniAlt, f.sniLeaves(b, 1)[0]}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			next := contents[i%2]
			i++
			providers[0].setQuietly(next.CertPEM, next.KeyPEM)
			if err := c.RunOnce(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("startup/n=%d", maxSNI), func(b *testing.B) { benchStartup(b, 0) })
	b.Run(fmt.Sprintf("startup-per-provider-metrics/n=%d", maxSNI), func(b *testing.B) { benchStartup(b, 2*maxSNI) })
}

// startupRuns numbers the start-up measurements of this process, so that
// each uses provider names of its own: a name seen before would find its
// metric series already made, and the start-up would look cheaper than a
// process's first.
var startupRuns int

// benchStartup measures a start-up with ControllerConfig.PerProviderMetricsLimit
// set to metricsLimit.
func benchStartup(b *testing.B, metricsLimit int) {
	f := benchCerts(b)
	client := &tls.Config{ServerName: "host-0.example.test", RootCAs: x509Pool(b, f.ca), MinVersion: tls.VersionTLS13}
	var (
		total    time.Duration
		perCert  float64
		measured int
	)
	for b.Loop() {
		startupRuns++
		sniCerts, _ := scaleProviders(b, maxSNI, fmt.Sprintf("startup%d-sni", startupRuns))
		serving := staticCertKey(b, f.serving[pki.ECDSAP256])
		before := heapAfterGC()

		start := time.Now()
		c := newController(b, ControllerConfig{Serving: serving, SNI: sniCerts, PerProviderMetricsLimit: metricsLimit})
		addr := tlstest.Server(b, c.TLSConfig())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.Run(ctx, 1)
		}()
		// Wait for the controller to be ready with a cheap check, then
		// handshake: a handshake attempt every millisecond would cost the
		// client's key generation each time, on the cores the start-up
		// being measured runs on.
		for {
			var err error
			if c.HasSynced() {
				if _, err = tlstest.Handshake(addr, client); err == nil {
					break
				}
			}
			if time.Since(start) > 10*time.Minute {
				cancel()
				b.Fatalf("no successful handshake within 10 minutes of start (synced %v): %v", c.HasSynced(), err)
			}
			time.Sleep(time.Millisecond)
		}
		total += time.Since(start)

		perCert += float64(heapAfterGC()-before) / maxSNI
		measured++
		cancel()
		<-done
		runtime.KeepAlive(sniCerts)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(measured), "ms-to-first-handshake")
	b.ReportMetric(perCert/float64(measured), "B/cert")
}

// heapAfterGC returns the bytes of live heap objects after a full GC.
func heapAfterGC() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
