package sni_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/sni"
)

// BenchmarkRotationPropagation measures how long a new certificate takes
// from its source to the first handshake that presents it, through the
// provider's own change detection and the controller's work queue. It
// reports p50 and p99 in milliseconds; ns/op includes making the
// certificate.
func BenchmarkRotationPropagation(b *testing.B) {
	klog.LogToStderr(false)
	b.Run("file-kubelet-symlink-swap", benchFilePropagation)
	b.Run("self-signed-renew", benchSelfSignedPropagation)
}

// serveAndPoll runs ctrl and its provider, and returns a function that
// polls handshakes until the served serial is want, returning the elapsed
// time since start.
func serveAndPoll(b *testing.B, ctrl *sni.DynamicServingCertificateController, provider dynamiccertificates.ControllerRunner) func(start time.Time, want string) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	if err := provider.RunOnce(ctx); err != nil {
		b.Fatal(err)
	}
	if err := ctrl.RunOnce(ctx); err != nil {
		b.Fatal(err)
	}
	go provider.Run(ctx, 1)
	go ctrl.Run(ctx, 1)
	addr := tlstest.Server(b, ctrl.TLSConfig())
	return func(start time.Time, want string) time.Duration {
		deadline := start.Add(10 * time.Second)
		for time.Now().Before(deadline) {
			cert, err := tlstest.Handshake(addr, &tls.Config{InsecureSkipVerify: true, ServerName: "bench.test"})
			if err == nil && cert.SerialNumber.Text(16) == want {
				return time.Since(start)
			}
			time.Sleep(time.Millisecond)
		}
		b.Fatalf("certificate %s not served within 10s", want)
		return 0
	}
}

func reportPercentiles(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	ms := func(q float64) float64 { return float64(d[int(q*float64(len(d)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
}

// benchFilePropagation swaps a kubelet-style ..data symlink to a new
// timestamped directory, as a Secret volume update does.
func benchFilePropagation(b *testing.B) {
	dir := b.TempDir()
	ca, err := pki.NewCA(pki.Request{CommonName: "bench-ca", Now: time.Now(), Lifetime: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	version := 0
	swap := func() string {
		leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "bench.test", DNSNames: []string{"bench.test"}, Now: time.Now(), Lifetime: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		version++
		ts := fmt.Sprintf("..v%d", version)
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			b.Fatal(err)
		}
		for name, data := range map[string][]byte{"tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM} {
			if err := os.WriteFile(filepath.Join(dir, ts, name), data, 0o600); err != nil {
				b.Fatal(err)
			}
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(ts, tmp); err != nil {
			b.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			b.Fatal(err)
		}
		return leaf.Cert.SerialNumber.Text(16)
	}
	swap()
	for _, name := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			b.Fatal(err)
		}
	}
	files, err := dynamiccert.NewFileCertKey(dynamiccert.FileCertKeyConfig{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")})
	if err != nil {
		b.Fatal(err)
	}
	poll := serveAndPoll(b, sni.NewDynamicServingCertificateController(nil, nil, files, nil), files)
	var lat []time.Duration
	for b.Loop() {
		start := time.Now()
		lat = append(lat, poll(start, swap()))
	}
	reportPercentiles(b, lat)
}

// benchSelfSignedPropagation steps a fake clock past the renewal time and
// lets the provider's own timer renew.
func benchSelfSignedPropagation(b *testing.B) {
	clk := clocktesting.NewFakeClock(time.Now())
	ss, err := dynamiccert.NewSelfSigned(dynamiccert.SelfSignedConfig{Hosts: []string{"bench.test"}, Lifetime: time.Hour, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	poll := serveAndPoll(b, sni.NewDynamicServingCertificateController(nil, nil, ss, nil, sni.WithClock(clk)), ss)
	var lat []time.Duration
	for b.Loop() {
		old := ss.Leaf().SerialNumber.Text(16)
		start := time.Now()
		clk.Step(40 * time.Minute) // past renew-at (2/3 of an hour)
		for ss.Leaf().SerialNumber.Text(16) == old {
			if time.Since(start) > 10*time.Second {
				b.Fatal("provider did not renew")
			}
			time.Sleep(100 * time.Microsecond)
		}
		lat = append(lat, poll(start, ss.Leaf().SerialNumber.Text(16)))
	}
	reportPercentiles(b, lat)
}
