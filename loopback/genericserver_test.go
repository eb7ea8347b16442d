package loopback_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/compatibility"
	"k8s.io/client-go/rest"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/loopback"
)

// genericServer is a minimal genericapiserver on 127.0.0.1:0 with an
// in-memory serving certificate for localhost, the loopback token as its
// only credential and system:masters as its only authorized group.
type genericServer struct {
	addr     string
	loopback *rest.Config
	cert     *loopback.Certificate // nil with upstream's loopback
	serving  *authority.SelfSigned
}

// newCodecs returns codecs for the unversioned meta types every server
// encodes (Status for errors, discovery documents).
func newCodecs() serializer.CodecFactory {
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	scheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"}, &metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	return serializer.NewCodecFactory(scheme)
}

// startGenericServer starts a server whose loopback comes from evercert's
// ApplyToConfig, or from upstream's SecureServingOptionsWithLoopback when
// upstream is set. It stops when the test or benchmark ends.
func startGenericServer(tb testing.TB, upstream bool) *genericServer {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: "serving"})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := server.NewConfig(newCodecs())
	cfg.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	ss := &options.SecureServingOptions{Listener: ln, ServerCert: options.GeneratableKeyCert{GeneratedCert: serving}}
	gs := &genericServer{addr: ln.Addr().String(), serving: serving}
	if upstream {
		err = ss.WithLoopback().ApplyToConfig(cfg)
	} else {
		if err = ss.ApplyTo(&cfg.SecureServing); err == nil {
			gs.cert, err = loopback.ApplyToConfig(cfg, loopback.CertificateConfig{})
		}
	}
	if err != nil {
		tb.Fatal(err)
	}
	cfg.Authentication.Authenticator = authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
		return nil, false, nil
	})
	cfg.Authorization.Authorizer = authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup)
	s, err := cfg.Complete(nil).New("loopback-test", server.NewEmptyDelegate())
	if err != nil {
		tb.Fatal(err)
	}
	gs.loopback = cfg.LoopbackClientConfig
	runServer(tb, s)
	return gs
}

// runServer runs s until the test or benchmark ends, and returns once its
// /readyz answers 200 through its loopback client config.
func runServer(tb testing.TB, s *server.GenericAPIServer) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.PrepareRun().RunWithContext(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			tb.Error("server did not stop within 60s")
		}
	})

	hc, err := rest.HTTPClientFor(s.LoopbackClientConfig)
	if err != nil {
		tb.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := hc.Get(s.LoopbackClientConfig.Host + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-done:
			done <- err // for the cleanup
			tb.Fatalf("server stopped before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("server not ready within 60s: %v", err)
		}
	}
}
