package loopback_test

import (
	"context"
	"net"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/klogtest"
	"github.com/evercert/evercert/loopback"
)

// BenchmarkLoopbackSetup compares setting up secure serving with a loopback
// certificate and client config: evercert's ApplyTo (certificate generation
// included) against upstream's SecureServingOptionsWithLoopback.ApplyTo
// (two RSA-2048 keys). Both apply the same SecureServingOptions first, with
// a pre-set serving certificate and listener.
func BenchmarkLoopbackSetup(b *testing.B) {
	klogtest.Discard(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: "serving"})
	if err != nil {
		b.Fatal(err)
	}
	newOptions := func() *options.SecureServingOptions {
		return &options.SecureServingOptions{Listener: ln, ServerCert: options.GeneratableKeyCert{GeneratedCert: serving}}
	}
	evercert := func(kt dynamiccert.KeyType) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var info *server.SecureServingInfo
				var cfg *rest.Config
				if err := newOptions().ApplyTo(&info); err != nil {
					b.Fatal(err)
				}
				if _, err := loopback.ApplyTo(&info, &cfg, loopback.CertificateConfig{KeyType: kt}); err != nil || cfg == nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("evercert", evercert(""))
	b.Run("evercert-rsa2048", evercert(dynamiccert.RSA2048))
	b.Run("upstream", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var info *server.SecureServingInfo
			var cfg *rest.Config
			if err := newOptions().WithLoopback().ApplyTo(&info, &cfg); err != nil || cfg == nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLoopbackRequests measures sequential GET /healthz requests
// through a loopback clientset against an in-process genericapiserver:
// evercert's rotating-trust config against upstream's static one, and
// upstream against a second upstream server (an A/A pair: the spread
// between two identical configs is what this machine's noise alone gives).
func BenchmarkLoopbackRequests(b *testing.B) {
	klogtest.Discard(b)
	for _, tc := range []struct {
		name     string
		upstream bool
	}{{"evercert", false}, {"upstream", true}, {"upstream-again", true}} {
		s := startGenericServer(b, tc.upstream)
		cs, err := kubernetes.NewForConfig(s.loopback)
		if err != nil {
			b.Fatal(err)
		}
		rc := cs.Discovery().RESTClient()
		ctx := context.Background()
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				if _, err := rc.Get().AbsPath("/healthz").DoRaw(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
