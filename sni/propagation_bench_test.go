package sni_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/klogtest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/sni"
)

const (
	// propagationDeadline bounds the wait for one rotation to be served. A
	// rotation that is not served by then is counted as missed, and its
	// latency recorded as the deadline (so percentiles stay a lower bound).
	propagationDeadline = 2 * time.Second
	// maxMissed is how many rotations a server may miss before it is no
	// longer polled, which keeps a benchmark whose watch broke bounded in
	// time: every later rotation counts as missed too. (Upstream's file
	// watch, once broken, is re-established only a minute later.)
	maxMissed = 3
)

// BenchmarkRotationPropagation measures how long a new certificate takes
// from its source to the first TLS handshake on 127.0.0.1 that presents it,
// through the provider's own change detection and the controller's work
// queue. It reports p50 and p99 in milliseconds; ns/op is the whole
// iteration (writing the files, or renewing, plus waiting).
//
// The file-* sub-benchmarks apply one filesystem pattern per iteration to
// a single pair of files, watched in the same process by evercert's
// FileCertKey behind evercert's controller and by upstream's
// dynamiccertificates.NewDynamicServingContentFromFiles behind upstream's
// DynamicServingCertificateController, each Run as upstream users run
// them. The clock starts when the pattern's last filesystem call has
// returned; one goroutine per server then handshakes in a tight loop
// until the new serial is presented. Metrics are evercert-p50-ms,
// evercert-p99-ms, upstream-p50-ms and upstream-p99-ms, and *-missed
// counts rotations not served within propagationDeadline (after maxMissed
// of them the server is no longer polled, and every later rotation counts
// as missed).
func BenchmarkRotationPropagation(b *testing.B) {
	klogtest.Discard(b)
	for _, pat := range filePatterns {
		b.Run("file-"+pat.name, func(b *testing.B) { benchFilePropagation(b, pat) })
	}
	b.Run("self-signed-renew", benchSelfSignedPropagation)
}

// filePattern is one way certificate files are replaced on disk.
type filePattern struct {
	name string
	// write puts a pair on disk in dir, where the served paths are
	// dir/tls.crt and dir/tls.key. It is also used for the first pair.
	write func(b *testing.B, dir string, version int, cert, key []byte)
}

var filePatterns = []filePattern{
	{name: "kubelet-symlink-swap", write: kubeletSwap},
	{name: "in-place-rewrite", write: func(b *testing.B, dir string, _ int, cert, key []byte) {
		writeFile(b, filepath.Join(dir, "tls.crt"), cert)
		writeFile(b, filepath.Join(dir, "tls.key"), key)
	}},
	{name: "rename-over", write: func(b *testing.B, dir string, _ int, cert, key []byte) {
		for name, data := range map[string][]byte{"tls.crt": cert, "tls.key": key} {
			tmp := filepath.Join(dir, "."+name+".tmp")
			writeFile(b, tmp, data)
			if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
				b.Fatal(err)
			}
		}
	}},
	{name: "remove-recreate", write: func(b *testing.B, dir string, _ int, cert, key []byte) {
		for _, name := range []string{"tls.crt", "tls.key"} {
			if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
				b.Fatal(err)
			}
		}
		writeFile(b, filepath.Join(dir, "tls.crt"), cert)
		writeFile(b, filepath.Join(dir, "tls.key"), key)
	}},
}

func writeFile(b *testing.B, path string, data []byte) {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		b.Fatal(err)
	}
}

// kubeletSwap does what the kubelet's AtomicWriter does for a Secret
// volume: the payload goes into a new timestamped directory, a ..data_tmp
// symlink to it is renamed over ..data, the user-visible names are symlinks
// through ..data, and the previous timestamped directory is removed.
func kubeletSwap(b *testing.B, dir string, version int, cert, key []byte) {
	ts := fmt.Sprintf("..v%d", version)
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		b.Fatal(err)
	}
	writeFile(b, filepath.Join(dir, ts, "tls.crt"), cert)
	writeFile(b, filepath.Join(dir, ts, "tls.key"), key)
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				b.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			b.Fatal(err)
		}
	}
}

// propagationServer is one server under measurement and its latencies.
type propagationServer struct {
	name   string
	addr   string
	lat    []time.Duration
	missed int
}

// pollHandshakes handshakes with addr in a tight loop until it presents
// want or deadline passes, and returns the time from start to the end of
// the first handshake that presented want.
func pollHandshakes(addr string, start, deadline time.Time, want string) (time.Duration, bool) {
	cfg := &tls.Config{InsecureSkipVerify: true, ServerName: "bench.test"}
	for time.Now().Before(deadline) {
		cert, err := tlstest.Handshake(addr, cfg)
		if err == nil && cert.SerialNumber.Text(16) == want {
			return time.Since(start), true
		}
	}
	return propagationDeadline, false
}

// measure polls every server that has not missed maxMissed rotations yet,
// concurrently, for want, from start. The others miss this one too.
func measure(servers []*propagationServer, start time.Time, want string) {
	deadline := start.Add(propagationDeadline)
	var wg sync.WaitGroup
	for _, s := range servers {
		if s.missed >= maxMissed {
			s.lat = append(s.lat, propagationDeadline)
			s.missed++
			continue
		}
		wg.Go(func() {
			d, ok := pollHandshakes(s.addr, start, deadline, want)
			s.lat = append(s.lat, d)
			if !ok {
				s.missed++
			}
		})
	}
	wg.Wait()
}

func percentile(d []time.Duration, q float64) float64 {
	return float64(d[int(q*float64(len(d)-1))]) / float64(time.Millisecond)
}

func reportServers(b *testing.B, servers []*propagationServer) {
	for _, s := range servers {
		if len(s.lat) == 0 {
			continue
		}
		slices.Sort(s.lat)
		b.ReportMetric(percentile(s.lat, 0.5), s.name+"-p50-ms")
		b.ReportMetric(percentile(s.lat, 0.99), s.name+"-p99-ms")
		b.ReportMetric(float64(s.missed), s.name+"-missed")
	}
}

// benchFilePropagation measures one filesystem pattern for evercert and
// upstream, fed from the same files in the same iterations.
func benchFilePropagation(b *testing.B, pat filePattern) {
	dir := b.TempDir()
	ca, err := pki.NewCA(pki.Request{CommonName: "bench-ca", Now: time.Now(), Lifetime: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	version := 0
	next := func() *pki.Issued {
		leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "bench.test", DNSNames: []string{"bench.test"}, Now: time.Now(), Lifetime: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		version++
		return leaf
	}
	first := next()
	pat.write(b, dir, version, first.CertPEM, first.KeyPEM)
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")

	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	b.Cleanup(func() {
		cancel()
		running.Wait()
	})

	// evercert: FileCertKey behind evercert's controller.
	files, err := dynamiccert.NewFileCertKey(dynamiccert.FileCertKeyConfig{CertFile: certPath, KeyFile: keyPath})
	if err != nil {
		b.Fatal(err)
	}
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: files})
	if err != nil {
		b.Fatal(err)
	}
	if err := files.RunOnce(ctx); err != nil {
		b.Fatal(err)
	}
	if err := ctrl.RunOnce(ctx); err != nil {
		b.Fatal(err)
	}
	running.Go(func() { files.Run(ctx, 1) })
	running.Go(func() { ctrl.Run(ctx, 1) })

	// upstream: wired as genericapiserver's SecureServingInfo does it.
	upFiles, err := dynamiccertificates.NewDynamicServingContentFromFiles("bench", certPath, keyPath)
	if err != nil {
		b.Fatal(err)
	}
	upCtrl := dynamiccertificates.NewDynamicServingCertificateController(&tls.Config{MinVersion: tls.VersionTLS12}, nil, upFiles, nil, nil)
	upFiles.AddListener(upCtrl)
	if err := upCtrl.RunOnce(); err != nil {
		b.Fatal(err)
	}
	running.Go(func() { upFiles.Run(ctx, 1) })
	running.Go(func() { upCtrl.Run(1, ctx.Done()) })

	servers := []*propagationServer{
		{name: "evercert", addr: tlstest.Server(b, ctrl.TLSConfig())},
		{name: "upstream", addr: tlstest.Server(b, &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: upCtrl.GetConfigForClient})},
	}
	// Both serve the first pair before the clock runs.
	measure(servers, time.Now(), first.Cert.SerialNumber.Text(16))
	for _, s := range servers {
		if s.missed > 0 {
			b.Fatalf("%s: first certificate not served within %v", s.name, propagationDeadline)
		}
		s.lat = s.lat[:0]
	}

	for b.Loop() {
		leaf := next()
		pat.write(b, dir, version, leaf.CertPEM, leaf.KeyPEM)
		measure(servers, time.Now(), leaf.Cert.SerialNumber.Text(16))
	}
	reportServers(b, servers)
}

// benchSelfSignedPropagation steps a fake clock past the renewal time and
// lets the provider's own timer renew. The CA lives for ten years, so that
// no CA rotation (whose observed phases span several steps) falls within
// the bounded iterations: this measures leaf renewals only.
func benchSelfSignedPropagation(b *testing.B) {
	clk := clocktesting.NewFakeClock(time.Now())
	ss, err := authority.NewSelfSigned(authority.SelfSignedConfig{Hosts: []string{"bench.test"}, Lifetime: time.Hour, CALifetime: 10 * 365 * 24 * time.Hour, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	b.Cleanup(func() {
		cancel()
		running.Wait()
	})
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: ss, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	if err := ss.RunOnce(ctx); err != nil {
		b.Fatal(err)
	}
	if err := ctrl.RunOnce(ctx); err != nil {
		b.Fatal(err)
	}
	running.Go(func() { ss.Run(ctx, 1) })
	running.Go(func() { ctrl.Run(ctx, 1) })
	server := &propagationServer{name: "evercert", addr: tlstest.Server(b, ctrl.TLSConfig())}
	// Step only once everything that waits on the clock is waiting again:
	// a step taken after a renewal but before the provider armed its next
	// timer would push that timer a step too far.
	waitIdle := func(n int) {
		for deadline := time.Now().Add(propagationDeadline); clk.Waiters() < n; {
			if time.Now().After(deadline) {
				b.Fatalf("%d waiters on the fake clock, want %d", clk.Waiters(), n)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	waitIdle(1)
	time.Sleep(50 * time.Millisecond)
	idle := clk.Waiters()
	for b.Loop() {
		waitIdle(idle)
		old := ss.Leaf().SerialNumber.Text(16)
		start := time.Now()
		clk.Step(40 * time.Minute) // past renew-at (2/3 of an hour)
		for ss.Leaf().SerialNumber.Text(16) == old {
			if time.Since(start) > propagationDeadline {
				b.Fatal("provider did not renew")
			}
			time.Sleep(100 * time.Microsecond)
		}
		measure([]*propagationServer{server}, start, ss.Leaf().SerialNumber.Text(16))
	}
	if len(server.lat) > 0 {
		slices.Sort(server.lat)
		b.ReportMetric(percentile(server.lat, 0.5), "p50-ms")
		b.ReportMetric(percentile(server.lat, 0.99), "p99-ms")
	}
}
