package app

import (
	"context"
	"fmt"
	"net"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/compatibility"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/loopback"
)

// Server is a prepared example server.
type Server struct {
	// GenericAPIServer is the underlying server; tests may add handlers to
	// its NonGoRestfulMux before Run.
	GenericAPIServer *genericapiserver.GenericAPIServer
	// Loopback is the rotating loopback certificate.
	Loopback *loopback.Certificate
	// Serving is the in-memory self-signed serving certificate, or nil when
	// certificate files were given.
	Serving *dynamiccert.SelfSigned
	// Addr is the HOST:PORT the server listens on.
	Addr string
}

// NewServer validates o and builds the server, listening already (so Addr
// is known) but not yet serving. o.SecureServing gets its Listener set.
func NewServer(o *Options) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	ss := o.SecureServing
	if ss.Listener == nil && ss.BindPort == 0 {
		// Upstream treats port 0 as "secure serving off"; here it means "any
		// free port", so listen first and hand the listener over.
		ln, _, err := genericoptions.CreateListener(ss.BindNetwork, net.JoinHostPort(ss.BindAddress.String(), "0"), net.ListenConfig{})
		if err != nil {
			return nil, fmt.Errorf("failed to create listener: %w", err)
		}
		ss.Listener = ln
	}

	s := &Server{}
	if ss.ServerCert.CertKey.CertFile == "" && ss.ServerCert.CertKey.KeyFile == "" && ss.ServerCert.GeneratedCert == nil {
		hosts := append([]string(nil), dynamiccert.DefaultSelfSignedHosts...)
		if ip := ss.BindAddress; ip != nil && !ip.IsUnspecified() && !ip.IsLoopback() {
			hosts = append(hosts, ip.String())
		}
		serving, err := dynamiccert.NewSelfSigned(dynamiccert.SelfSignedConfig{Name: "serving", Hosts: hosts})
		if err != nil {
			return nil, err
		}
		ss.ServerCert.GeneratedCert = serving
		s.Serving = serving
	}

	codecs := serializer.NewCodecFactory(newScheme())
	cfg := genericapiserver.NewConfig(codecs)
	cfg.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	if err := ss.ApplyTo(&cfg.SecureServing); err != nil {
		return nil, err
	}
	cert, err := loopback.ApplyToConfig(cfg, loopback.Options{Validity: o.LoopbackValidity, Clock: o.LoopbackClock})
	if err != nil {
		return nil, err
	}
	s.Loopback = cert
	if err := applyAuth(cfg); err != nil {
		return nil, err
	}
	if o.SelfcheckInterval > 0 {
		if err := cfg.AddPostStartHook(SelfcheckHookName, selfcheckHook(o.SelfcheckInterval)); err != nil {
			return nil, err
		}
	}
	// Complete unions the loopback token authenticator (system:apiserver in
	// system:masters) in front of ours.
	gs, err := cfg.Complete(nil).New("evercert-example-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, err
	}
	s.GenericAPIServer = gs
	host, port, err := net.SplitHostPort(cfg.SecureServing.Listener.Addr().String())
	if err != nil {
		return nil, err
	}
	if p, err := strconv.Atoi(port); err == nil {
		ss.BindPort = p
	}
	s.Addr = net.JoinHostPort(host, port)
	return s, nil
}

// newScheme holds the unversioned meta types every server encodes (Status
// for errors, discovery documents); there are no API groups.
func newScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	scheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	return scheme
}

// Run serves until ctx is done, then shuts down gracefully and returns.
func (s *Server) Run(ctx context.Context) error {
	s.GenericAPIServer.AddPostStartHookOrDie("evercert-serving-on", func(genericapiserver.PostStartHookContext) error {
		klog.Infof("serving on https://%s", s.Addr)
		return nil
	})
	return s.GenericAPIServer.PrepareRun().RunWithContext(ctx)
}

// Run builds the server from o and serves until ctx is done.
func Run(ctx context.Context, o *Options) error {
	s, err := NewServer(o)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}
