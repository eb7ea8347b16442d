package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/sni"
)

// Serving is what Options build: the certificate providers, the sni
// controller that serves them, and the trust bundle clients should use.
// Serve runs it and serves HTTPS; an embedder with its own server (a
// genericapiserver, say) calls RunOnce and Run instead and uses Controller.
type Serving struct {
	opts *Options

	// Controller selects the certificate for each handshake.
	Controller *sni.DynamicServingCertificateController
	// Serving is the default certificate provider.
	Serving dynamiccertificates.CertKeyContentProvider
	// SNI are the providers selected by name, in precedence order.
	SNI []dynamiccertificates.SNICertKeyContentProvider
	// ClientCA verifies client certificates; nil when not configured.
	ClientCA dynamiccertificates.CAContentProvider
	// TrustBundle is the CA bundle clients should trust, when evercert knows
	// it (the self-signed default); nil otherwise.
	TrustBundle dynamiccertificates.CAContentProvider

	runners      []dynamiccertificates.ControllerRunner
	bundleFile   *bundleFileWriter   // nil without --ca-bundle-file
	clientCAFile *dynamiccert.FileCA // nil without --client-ca-file

	addrMu    sync.Mutex
	addr      net.Addr
	listening chan struct{}
}

// Build validates o and makes the providers and the sni controller. extraSNI
// providers (a loopback certificate, say) come first in SNI precedence.
// Nothing runs until Run.
func (o *Options) Build(extraSNI ...dynamiccertificates.SNICertKeyContentProvider) (*Serving, error) {
	if errs := o.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	s := &Serving{opts: o, SNI: append([]dynamiccertificates.SNICertKeyContentProvider(nil), extraSNI...), listening: make(chan struct{})}

	switch {
	case o.CertFile != "":
		p, err := dynamiccert.NewFileCertKey(dynamiccert.FileCertKeyConfig{
			Name: "serving-cert", CertFile: o.CertFile, KeyFile: o.KeyFile,
			ResyncInterval: o.ResyncInterval, Clock: o.Clock,
		})
		if err != nil {
			return nil, fmt.Errorf("--tls-cert-file: %w", err)
		}
		s.Serving = p
		s.runners = append(s.runners, p)
	case o.TLSSecret != "" || o.CASecret != "":
		client, err := o.kubeClient()
		if err != nil {
			return nil, err
		}
		if o.TLSSecret != "" {
			ns, name, _ := splitNamespacedName(o.TLSSecret)
			p, err := dynamiccert.NewSecretCertKey(dynamiccert.SecretConfig{Name: "tls-secret", Namespace: ns, SecretName: name, Client: client, Clock: o.Clock})
			if err != nil {
				return nil, fmt.Errorf("--tls-secret: %w", err)
			}
			s.Serving = p
			s.runners = append(s.runners, p)
			break
		}
		ns, name, _ := splitNamespacedName(o.CASecret)
		p, err := dynamiccert.NewAuthority(dynamiccert.AuthorityConfig{
			Name: "ca-secret", Namespace: ns, SecretName: name, Client: client,
			Hosts: o.SelfSignedHosts, KeyTypes: o.keyTypes(), Lifetime: o.SelfSignedValidity, RenewBefore: o.SelfSignedRenewBefore,
			CALifetime: o.CAValidity, CARenewBefore: o.CARenewBefore, PropagationDelay: o.CAPropagationDelay,
			SkewTolerance: o.ClockSkewTolerance, ReplicaID: o.ReplicaID, Clock: o.Clock,
		})
		if err != nil {
			return nil, fmt.Errorf("--ca-secret (%s): %w", scheduleFlags, err)
		}
		s.Serving, s.TrustBundle = p, p
		s.runners = append(s.runners, p)
	case len(o.SNICertKeys) == 0:
		p, err := dynamiccert.NewSelfSigned(o.selfSignedConfig())
		if err != nil {
			return nil, fmt.Errorf("self-signed default (%s): %w", scheduleFlags, err)
		}
		s.Serving, s.TrustBundle = p, p
		s.runners = append(s.runners, p)
	}
	for i, nck := range o.SNICertKeys {
		p, err := dynamiccert.NewFileCertKey(dynamiccert.FileCertKeyConfig{
			Name:     fmt.Sprintf("sni-serving-cert::%s::%s", nck.CertFile, nck.KeyFile),
			CertFile: nck.CertFile, KeyFile: nck.KeyFile, SNINames: nck.Names,
			ResyncInterval: o.ResyncInterval, Clock: o.Clock,
		})
		if err != nil {
			return nil, fmt.Errorf("--tls-sni-cert-key[%d]: %w", i, err)
		}
		s.SNI = append(s.SNI, p)
		s.runners = append(s.runners, p)
	}
	if o.ClientCAFile != "" {
		p, err := dynamiccert.NewFileCA(dynamiccert.FileCAConfig{
			Name: "client-ca-bundle", File: o.ClientCAFile, ResyncInterval: o.ResyncInterval, Clock: o.Clock,
		})
		if err != nil {
			return nil, fmt.Errorf("--client-ca-file: %w", err)
		}
		s.ClientCA, s.clientCAFile = p, p
		s.runners = append(s.runners, p)
	}
	for _, p := range extraSNI {
		if r, ok := p.(dynamiccertificates.ControllerRunner); ok {
			s.runners = append(s.runners, r)
		}
	}

	if o.CABundleFile != "" && s.TrustBundle != nil {
		s.bundleFile = newBundleFileWriter(o.CABundleFile, s.TrustBundle, o.Clock)
		// A successor CA signs only once the file holds it.
		if issuer, ok := s.TrustBundle.(interface{ AddObserver(dynamiccert.Observer) }); ok {
			issuer.AddObserver(s.bundleFile)
		}
	}

	base, err := o.baseTLSConfig()
	if err != nil {
		return nil, err
	}
	s.Controller, err = sni.NewDynamicServingCertificateController(sni.ControllerConfig{
		Base: base, ClientCA: s.ClientCA, Serving: s.Serving, SNI: s.SNI, Clock: o.Clock,
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// kubeClient builds the client for Secret sources from --kubeconfig, or
// from the in-cluster config when it is empty.
func (o *Options) kubeClient() (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	return client, nil
}

// baseTLSConfig is the template every served tls.Config is cloned from:
// the version floor, the TLS 1.2 suites, and HTTP/2 first in ALPN. It
// refuses a suite list HTTP/2 cannot use, as Validate does.
func (o *Options) baseTLSConfig() (*tls.Config, error) {
	minVersion, err := cliflag.TLSVersion(o.MinTLSVersion)
	if err != nil {
		return nil, fmt.Errorf("--tls-min-version: %w", err)
	}
	suites, err := cliflag.TLSCipherSuites(o.CipherSuites)
	if err != nil {
		return nil, fmt.Errorf("--tls-cipher-suites: %w", err)
	}
	// The same rule as Validate: http.Server.ServeTLS would refuse this
	// config only once the listener is open.
	if err := checkHTTP2CipherSuites(minVersion, suites); err != nil {
		return nil, fmt.Errorf("--tls-cipher-suites: %w", err)
	}
	return &tls.Config{
		MinVersion:   minVersion,
		CipherSuites: suites,
		NextProtos:   []string{"h2", "http/1.1"},
	}, nil
}

// RunOnce loads every source once and builds the first snapshot. It fails
// if nothing can be served, if --client-ca-file cannot be loaded (a missing
// file, a directory, content that is not a PEM CA bundle: no client
// certificate could ever be verified, so the server must not start as if
// it could; the error names the flag and the file), or if --ca-bundle-file
// cannot be written. Another source that fails alone (an SNI file that does
// not exist yet) is logged and retried by Run. Call it before Run when
// start-up must fail fast; Serve does.
func (s *Serving) RunOnce(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for _, r := range s.runners {
		if r == s.clientCAFile {
			if err := r.RunOnce(ctx); err != nil {
				// The error names the file; the provider has counted it.
				return fmt.Errorf("--client-ca-file: %w", err)
			}
			continue
		}
		if err := r.RunOnce(ctx); err != nil {
			// A file that is missing now may appear later; the controller
			// decides below whether anything at all can be served.
			logger.Error(err, "Initial load failed; will keep retrying")
		}
	}
	if err := s.Controller.RunOnce(ctx); err != nil {
		return fmt.Errorf("no serving certificate: %w", err)
	}
	if s.bundleFile != nil {
		if err := s.bundleFile.write(logger); err != nil {
			return fmt.Errorf("--ca-bundle-file: %w", err)
		}
	}
	return nil
}

// Run keeps the sources, the controller (with workers workers; 1 when
// workers < 1) and --ca-bundle-file current until ctx is done, and returns
// once every goroutine it started has stopped. Without a RunOnce first,
// the loops load the sources themselves and HasSynced turns true once they
// have.
func (s *Serving) Run(ctx context.Context, workers int) {
	if workers < 1 {
		workers = 1
	}
	var wg sync.WaitGroup
	for _, r := range s.runners {
		wg.Go(func() { r.Run(ctx, 1) })
	}
	wg.Go(func() { s.Controller.Run(ctx, workers) })
	if s.bundleFile != nil {
		wg.Go(func() { s.bundleFile.run(ctx) })
	}
	wg.Wait()
}

// HasSynced reports whether a certificate is loaded and, with
// --ca-bundle-file, the bundle file has been written once: the server may
// listen. It is safe for concurrent use and has the shape of
// cache.InformerSynced.
func (s *Serving) HasSynced() bool {
	return s.Controller.HasSynced() && (s.bundleFile == nil || s.bundleFile.hasWritten())
}
