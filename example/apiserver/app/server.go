package app

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/compatibility"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
	certv1alpha1 "github.com/evercert/evercert/example/apiserver/apis/certificates/v1alpha1"
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
	Serving *authority.SelfSigned
	// Addr is the HOST:PORT the server listens on.
	Addr string
	// Publisher keeps the caBundle of the APIService up to date once it is
	// registered; nil when the server does not register (see
	// Options.Registers). Its Ready channel closes after the first
	// successful publish.
	Publisher *cabundle.Publisher

	certificates *certificatesAPI
	registration *registration
	// background counts the goroutines Run must wait for.
	background sync.WaitGroup
}

// NewServer validates o and builds the server, listening already (so Addr
// is known) but not yet serving. o.SecureServing gets its Listener set.
// With o.Kubeconfig it reads the authentication configuration from that
// kube-apiserver, so the kube-apiserver must be reachable.
func NewServer(o *Options) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var svcNamespace, svcName string
	if o.Registers() {
		svcNamespace, svcName, _ = o.APIServiceServiceRef() // validated
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
	if !o.servedByFiles() {
		hosts := slices.Clone(o.SelfSignedHosts)
		if len(hosts) == 0 {
			hosts = slices.Clone(authority.DefaultSelfSignedHosts)
		}
		if ip := ss.BindAddress; ip != nil && !ip.IsUnspecified() && !ip.IsLoopback() && !slices.Contains(hosts, ip.String()) {
			hosts = append(hosts, ip.String())
		}
		if svcName != "" {
			// The aggregator verifies the serving certificate for this name.
			if dns := svcName + "." + svcNamespace + ".svc"; !slices.Contains(hosts, dns) {
				hosts = append(hosts, dns)
			}
		}
		serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{
			Name: "serving", Hosts: hosts, Lifetime: o.SelfSignedValidity, RenewBefore: o.SelfSignedRenewBefore,
		})
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		ss.ServerCert.GeneratedCert = serving
		s.Serving = serving
	}

	codecs := serializer.NewCodecFactory(newScheme())
	cfg := genericapiserver.NewConfig(codecs)
	cfg.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	if err := ss.ApplyTo(&cfg.SecureServing); err != nil {
		return nil, fmt.Errorf("secure serving: %w", err)
	}
	cert, err := loopback.ApplyToConfig(cfg, loopback.CertificateConfig{Validity: o.LoopbackValidity, Clock: o.LoopbackClock})
	if err != nil {
		return nil, fmt.Errorf("loopback certificate: %w", err)
	}
	s.Loopback = cert
	if o.Delegated() {
		err = applyDelegatedAuth(cfg, o)
	} else {
		err = applyAuth(cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("authentication and authorization: %w", err)
	}
	if o.SelfcheckInterval > 0 {
		if err := cfg.AddPostStartHook(SelfcheckHookName, selfcheckHook(o.SelfcheckInterval)); err != nil {
			return nil, err
		}
	}
	if o.Registers() {
		if s.registration, err = newServerRegistration(o, s.Serving, svcNamespace, svcName); err != nil {
			return nil, err
		}
		s.Publisher = s.registration.publisher
		if err := cfg.AddPostStartHook(RegistrationHookName, func(hookCtx genericapiserver.PostStartHookContext) error {
			// The goroutine ends with the hook context, which is cancelled
			// when the server stops; Run waits for it.
			s.background.Go(func() { s.registration.run(hookCtx) })
			return nil
		}); err != nil {
			return nil, err
		}
	}
	// Complete unions the loopback token authenticator (system:apiserver in
	// system:masters) in front of ours.
	gs, err := cfg.Complete(nil).New("evercert-example-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("building the generic API server: %w", err)
	}
	s.GenericAPIServer = gs
	s.certificates = installCertificatesAPI(gs, cert)
	host, port, err := net.SplitHostPort(cfg.SecureServing.Listener.Addr().String())
	if err != nil {
		return nil, fmt.Errorf("listener address: %w", err)
	}
	if p, err := strconv.Atoi(port); err == nil {
		ss.BindPort = p
	}
	s.Addr = net.JoinHostPort(host, port)
	return s, nil
}

// newServerRegistration builds the APIService registration: the caBundle
// source is the in-memory serving CA bundle, or the --apiservice-ca-file
// bundle when the serving certificate comes from files.
func newServerRegistration(o *Options, serving *authority.SelfSigned, namespace, name string) (*registration, error) {
	kubeConfig, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading --kubeconfig %s: %w", o.Kubeconfig, err)
	}
	var source dynamiccertificates.CAContentProvider = serving
	var runner dynamiccertificates.ControllerRunner
	if serving == nil {
		fileCA, err := dynamiccert.NewFileCA(dynamiccert.FileCAConfig{Name: "apiservice-ca", File: o.APIServiceCAFile})
		if err != nil {
			return nil, fmt.Errorf("--apiservice-ca-file: %w", err)
		}
		source, runner = fileCA, fileCA
	}
	return newRegistration(kubeConfig, namespace, name, o.APIServicePort, source, runner)
}

// newScheme holds the unversioned meta types every server encodes (Status
// for errors, discovery documents) and the certificates.evercert.io types.
func newScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	scheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	utilruntime.Must(certv1alpha1.AddToScheme(scheme))
	return scheme
}

// ServingCertificates returns what GET
// /apis/certificates.evercert.io/v1alpha1/servingcertificates would return
// now, without going through HTTP.
func (s *Server) ServingCertificates() *certv1alpha1.ServingCertificateList {
	return s.certificates.List()
}

// Run serves until ctx is done, then shuts down gracefully and returns once
// the server and every goroutine it started (APIService registration and
// caBundle publishing) have stopped.
func (s *Server) Run(ctx context.Context) error {
	s.GenericAPIServer.AddPostStartHookOrDie("evercert-serving-on", func(genericapiserver.PostStartHookContext) error {
		klog.Infof("serving on https://%s", s.Addr)
		return nil
	})
	err := s.GenericAPIServer.PrepareRun().RunWithContext(ctx)
	s.background.Wait()
	return err
}

// Run builds the server from o and serves until ctx is done.
func Run(ctx context.Context, o *Options) error {
	s, err := NewServer(o)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}
