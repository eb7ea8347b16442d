//go:build soak

// Package soak runs evercert through years of certificate expiry: on a fake
// clock (simulated time, real handshakes), through named fault scenarios
// with every component running its own loops (TestSoakFaults, fault_test.go),
// and on the real clock with lifetimes of seconds. Run with `make
// soak-short` (part of `make test`) or `make soak`.
package soak

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/loopback"
	"github.com/evercert/evercert/server"
	"github.com/evercert/evercert/sni"
)

var (
	years    = flag.Int("soak.years", 10, "simulated years for TestSoakSimulatedYears, and for TestSoakFaults in all unless -soak.cycles is set")
	duration = flag.Duration("soak.duration", 15*time.Second, "wall-clock duration of TestSoakRealTime")
	clients  = flag.Int("soak.clients", 4, "concurrent TLS clients")
)

const day = 24 * time.Hour

// report collects the numbers printed at the end of a soak.
type report struct {
	name                         string
	rotations                    map[string]float64
	handshakes, requests, failed atomic.Int64
	goroutinesBefore, heapBefore int
}

func newReport(name string) *report {
	r := &report{name: name}
	r.goroutinesBefore, r.heapBefore = snapshotRuntime()
	return r
}

func snapshotRuntime() (goroutines, heapKiB int) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), int(ms.HeapInuse / 1024)
}

// finish prints the report and checks that goroutines and heap are flat.
func (r *report) finish(t *testing.T) {
	// Let goroutines of closed connections and stopped loops exit.
	var g, heap int
	for range 50 {
		g, heap = snapshotRuntime()
		if g <= r.goroutinesBefore+5 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	total := 0.0
	for _, v := range r.rotations {
		total += v
	}
	t.Logf("soak report %s: rotations %.0f %v, handshakes %d, requests %d, failures %d, goroutines %d -> %d, heap in use %d KiB -> %d KiB",
		r.name, total, r.rotations, r.handshakes.Load(), r.requests.Load(), r.failed.Load(), r.goroutinesBefore, g, r.heapBefore, heap)
	assert.Zero(t, r.failed.Load(), "failed handshakes or requests")
	assert.LessOrEqual(t, g, r.goroutinesBefore+5, "goroutines must not grow with rotations")
	assert.Less(t, heap, r.heapBefore+64*1024, "heap must not grow with rotations")
}

// TestSoakSimulatedYears drives every provider through *years of simulated
// time on a fake clock, in one-day steps, with lifetimes of days. Every
// provider and the sni controller run their own Run loops; after each step
// the test waits until every loop waits on the clock again. Then a bounded
// pool of real TLS clients, whose clock is the fake clock, handshakes with
// every name; they trust the CA bundles as they were one step earlier, as a
// client refreshing its bundle daily would.
func TestSoakSimulatedYears(t *testing.T) {
	// x/net/http2 keeps each closed client connection's health-check timer
	// alive for 30 s; at this churn that is tens of MiB of garbage that is
	// not ours and would hide a real leak in the heap numbers.
	t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "0")
	rep := newReport("simulated")
	ctx, cancel := context.WithCancel(context.Background())
	sim := newSimClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	clk := sim.view("clients", 0, false) // read only: the clients' and the controller's time
	var activity atomic.Int64

	selfSigned := func(name, host string, lifetime time.Duration) *authority.SelfSigned {
		p, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: name, Hosts: []string{host}, Lifetime: lifetime, Clock: sim.view(name, 0, true)})
		require.NoError(t, err)
		return p
	}
	serving := selfSigned("soak-serving", "localhost", 3*day)
	short := selfSigned("soak-short", "short.test", 36*time.Hour)
	daily := selfSigned("soak-daily", "daily.test", 30*time.Hour)
	api := newFakeAPI()
	ca, err := authority.New(authority.Config{
		Name: "soak-authority", Namespace: "ns", SecretName: "ca", Client: api.cs,
		Hosts: []string{"webhook.test"}, Lifetime: 4 * day, Clock: sim.view("soak-authority", 0, true),
	})
	require.NoError(t, err)

	// A file pair rewritten by the test every five days, as a cert-manager
	// issued Secret volume would be (each file by rename, as the kubelet
	// does).
	dir := t.TempDir()
	fileCA, err := pki.NewCA(pki.Request{CommonName: "file-ca", Now: clk.Now(), Lifetime: time.Duration(*years+1) * 366 * day})
	require.NoError(t, err)
	var fileLeaf *x509.Certificate
	writePair := func() {
		leaf, err := pki.IssueLeaf(fileCA, pki.Request{CommonName: "file.test", DNSNames: []string{"file.test"}, Now: clk.Now(), Lifetime: 10 * day})
		require.NoError(t, err)
		for name, data := range map[string][]byte{"tls.key": leaf.KeyPEM, "tls.crt": leaf.CertPEM} {
			path := filepath.Join(dir, name)
			require.NoError(t, os.WriteFile(path+".tmp", data, 0o600))
			require.NoError(t, os.Rename(path+".tmp", path))
		}
		fileLeaf = leaf.Cert
	}
	writePair()
	files, err := dynamiccert.NewFileCertKey(dynamiccert.FileCertKeyConfig{
		Name: "soak-file", CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), Clock: sim.view("soak-file", 0, false),
	})
	require.NoError(t, err)

	lb, err := loopback.NewCertificate(loopback.CertificateConfig{Validity: 2 * day, Clock: sim.view(loopback.ProviderName, 0, true)})
	require.NoError(t, err)

	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: serving,
		SNI: []dynamiccertificates.SNICertKeyContentProvider{lb, short, daily, ca, files}, Clock: clk})
	require.NoError(t, err)
	leaves := map[string]func() *x509.Certificate{
		serving.Name(): serving.Leaf, short.Name(): short.Leaf, daily.Name(): daily.Leaf,
		ca.Name(): ca.Leaf, lb.Name(): lb.Leaf,
		files.Name(): func() *x509.Certificate {
			if c := parsedLeaf(files); c != nil {
				return c.Leaf
			}
			return nil
		},
	}
	for _, p := range []dynamiccertificates.Notifier{serving, short, daily, ca, files, lb, ctrl} {
		p.AddListener(activityListener{&activity})
	}
	var wg sync.WaitGroup
	for _, r := range []dynamiccertificates.ControllerRunner{serving, short, daily, ca, files, lb, ctrl} {
		wg.Go(func() { r.Run(ctx, 1) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	addr := serveHTTPS(t, ctrl)

	// settle waits until every loop waits on the clock again and the
	// controller serves every provider's current certificate.
	settle := func() {
		t.Helper()
		settleLoops(t, settleSpec{
			sim:      sim,
			what:     func() string { return "simulated at " + clk.Now().Format(time.RFC3339) },
			activity: func() int64 { return activity.Load() + api.calls.Load() },
			notSettled: func() string {
				if c := parsedLeaf(files); c == nil || !c.Leaf.Equal(fileLeaf) {
					return "the file provider has not loaded the files yet"
				}
				served := map[string]string{}
				for _, s := range ctrl.Served() {
					served[s.Provider] = s.Serial
				}
				for name, leaf := range leaves {
					c := leaf()
					if c == nil {
						return name + " has no certificate yet"
					}
					if served[name] != c.SerialNumber.Text(16) {
						return "the controller does not serve " + name + "'s current certificate yet"
					}
				}
				return ""
			},
			hotLoop: func() {
				t.Errorf("at %s: a loop spins on timers that are already due: %v", clk.Now().Format(time.RFC3339), sim.dueOwners())
			},
			describe: func() string { return "API: " + api.verbs() + "\n" + api.lastRequests() },
		})
	}
	settle()

	// The loopback client is built once and must work through every
	// rotation of the loopback certificate.
	lbConfig, err := lb.RestConfig(addr, "")
	require.NoError(t, err)
	lbClient, err := kubernetes.NewForConfig(lbConfig)
	require.NoError(t, err)
	loopbackRequest := func() {
		rep.requests.Add(1)
		if err := lbClient.Discovery().RESTClient().Get().AbsPath("/healthz").Do(ctx).Error(); err != nil {
			rep.failed.Add(1)
			t.Errorf("loopback request at %s: %v", clk.Now().Format(time.RFC3339), err)
		}
	}

	type target struct {
		name   string
		bundle func() []byte
	}
	targets := []target{
		{"localhost", serving.CurrentCABundleContent},
		{"short.test", short.CurrentCABundleContent},
		{"daily.test", daily.CurrentCABundleContent},
		{"webhook.test", ca.CurrentCABundleContent},
		{"file.test", func() []byte { return fileCA.CertPEM }},
	}
	previous := make([][]byte, len(targets))
	for i, tg := range targets {
		previous[i] = tg.bundle()
	}

	handshakeAll := func(bundles [][]byte) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, *clients)
		for i, tg := range targets {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				rep.handshakes.Add(1)
				_, err := tlstest.Dial(addr, &tls.Config{ServerName: tg.name, RootCAs: tlstest.Pool(t, bundles[i]), Time: clk.Now})
				if err != nil {
					rep.failed.Add(1)
					served, _ := tlstest.Dial(addr, &tls.Config{ServerName: tg.name, InsecureSkipVerify: true})
					var bundleSerials []string
					certs, _ := pki.ParseCABundle(bundles[i])
					for _, c := range certs {
						bundleSerials = append(bundleSerials, c.SerialNumber.Text(16)[:8]+"/"+c.NotBefore.Format(time.RFC3339))
					}
					t.Errorf("%s at %s: %v (served serial %s issuer key %x notBefore %s; trusted CAs %v)", tg.name, clk.Now().Format(time.RFC3339), err,
						served.SerialNumber.Text(16), served.AuthorityKeyId, served.NotBefore.Format(time.RFC3339), bundleSerials)
				}
			})
		}
		wg.Wait()
	}

	steps := *years * 365
	for step := 1; step <= steps && !t.Failed(); step++ {
		jumped := false
		switch step {
		case steps / 3:
			// A machine suspended for 200 days wakes up.
			sim.step(200 * day)
			jumped = true
		case 2 * steps / 3:
			// NTP steps the clock back a minute.
			sim.step(-time.Minute)
		default:
			sim.step(day)
		}
		if step%5 == 0 || jumped {
			writePair()
		}
		settle()
		api.cs.ClearActions() // the fake clientset records every request
		if jumped {
			// Nothing issued before the jump is still valid: clients must
			// fetch the new bundles, as they would after any outage.
			for i, tg := range targets {
				previous[i] = tg.bundle()
			}
		}
		handshakeAll(previous)
		loopbackRequest()
		if step == 30 {
			// Measure growth from here: connections and caches warmed up.
			rep.goroutinesBefore, rep.heapBefore = snapshotRuntime()
		}
		for i, tg := range targets {
			previous[i] = tg.bundle()
		}
	}
	rep.rotations = map[string]float64{}
	for _, name := range []string{"soak-serving", "soak-short", "soak-daily", "soak-authority", "soak-file", loopback.ProviderName} {
		rep.rotations[name] = certmetricstest.Rotations(t, name)
	}
	rep.finish(t)
	total := 0.0
	for _, v := range rep.rotations {
		total += v
	}
	assert.GreaterOrEqual(t, total, 10000.0*float64(*years)/10, "rotations over the simulated years")
}

// serveHTTPS serves 200 OK over HTTPS on 127.0.0.1 with the controller's
// TLS config until the test ends.
func serveHTTPS(t *testing.T, ctrl *sni.DynamicServingCertificateController) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{
		TLSConfig:         ctrl.TLSConfig(),
		ReadHeaderTimeout: 10 * time.Second,
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }),
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ln.Addr().String()
}

// TestSoakRealTime runs the server with a self-signed certificate that lives
// three seconds (its CA nine) for -soak.duration, while clients that re-read
// the CA bundle file before every request, as a real client reloading its
// trust store would, keep calling it.
func TestSoakRealTime(t *testing.T) {
	rep := newReport("real-time")
	o := server.NewOptions()
	o.SecurePort = 0
	o.SelfSignedValidity = 3 * time.Second
	o.CABundleFile = filepath.Join(t.TempDir(), "ca.crt")
	s, err := o.Build()
	require.NoError(t, err)
	mux := http.NewServeMux()
	s.InstallHandlers(mux)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, mux) }()
	select {
	case <-s.Listening():
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	url := fmt.Sprintf("https://localhost:%d/healthz", s.Addr().(*net.TCPAddr).Port)
	before := certmetricstest.Rotations(t, "self-signed")

	deadline := time.Now().Add(*duration)
	var wg sync.WaitGroup
	for range *clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				bundle, err := os.ReadFile(o.CABundleFile)
				if err != nil {
					rep.failed.Add(1)
					t.Errorf("reading bundle: %v", err)
					return
				}
				tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tlstest.Pool(t, bundle)}, ForceAttemptHTTP2: true}
				c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
				rep.requests.Add(1)
				resp, err := c.Get(url)
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				tr.CloseIdleConnections()
				if err != nil {
					rep.failed.Add(1)
					t.Errorf("request: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	cancel()
	require.NoError(t, <-done)
	rep.rotations = map[string]float64{"self-signed": certmetricstest.Rotations(t, "self-signed") - before}
	rep.finish(t)
	assert.GreaterOrEqual(t, rep.rotations["self-signed"], float64(*duration/(2*time.Second))-1, "several rotations")
}
