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

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/errlog"
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
	// apiSource is the runner of --tls-secret or --ca-secret, which reads
	// the API server (nil without either), and apiFlag names it ("--ca-secret
	// ns/name"): RunOnce retries it until --startup-timeout.
	apiSource dynamiccertificates.ControllerRunner
	apiFlag   string
	events    *eventSink // nil without --tls-secret or --ca-secret

	addrMu    sync.Mutex
	addr      net.Addr
	listening chan struct{}
}

// Build validates o and makes the providers and the sni controller. extraSNI
// providers (a loopback certificate, say) come first in SNI precedence.
// Nothing runs until Run.
//
// The providers of --tls-secret and --ca-secret send their Events (see
// dynamiccert's Reason constants) about the Secret, in its namespace, as
// EventsReportingController; RBAC must allow creating and patching
// events.k8s.io Events there.
func (o *Options) Build(extraSNI ...dynamiccertificates.SNICertKeyContentProvider) (*Serving, error) {
	return o.build(o.kubeClient, extraSNI...)
}

// build is Build with the client for Secret sources made by kubeClient.
func (o *Options) build(kubeClient func() (kubernetes.Interface, error), extraSNI ...dynamiccertificates.SNICertKeyContentProvider) (*Serving, error) {
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
		client, err := kubeClient()
		if err != nil {
			return nil, err
		}
		s.events = newEventSink(client)
		if o.TLSSecret != "" {
			ns, name, _ := splitNamespacedName(o.TLSSecret)
			p, err := dynamiccert.NewSecretCertKey(dynamiccert.SecretConfig{Name: "tls-secret", Namespace: ns, SecretName: name, Client: client, Clock: o.Clock,
				EventRecorder: s.events.recorder})
			if err != nil {
				return nil, fmt.Errorf("--tls-secret: %w", err)
			}
			s.Serving, s.apiSource, s.apiFlag = p, p, "--tls-secret "+o.TLSSecret
			s.runners = append(s.runners, p)
			break
		}
		ns, name, _ := splitNamespacedName(o.CASecret)
		p, err := authority.New(authority.Config{
			Name: "ca-secret", Namespace: ns, SecretName: name, Client: client,
			Hosts: o.SelfSignedHosts, KeyTypes: o.keyTypes(), Lifetime: o.SelfSignedValidity, RenewBefore: o.SelfSignedRenewBefore,
			CALifetime: o.CAValidity, CARenewBefore: o.CARenewBefore, PropagationDelay: o.CAPropagationDelay,
			SkewTolerance: o.ClockSkewTolerance, ReplicaID: o.ReplicaID, Clock: o.Clock, EventRecorder: s.events.recorder,
		})
		if err != nil {
			return nil, fmt.Errorf("--ca-secret (%s): %w", scheduleFlags, err)
		}
		s.Serving, s.TrustBundle, s.apiSource, s.apiFlag = p, p, p, "--ca-secret "+o.CASecret
		s.runners = append(s.runners, p)
	case len(o.SNICertKeys) == 0:
		p, err := authority.NewSelfSigned(o.selfSignedConfig())
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
		if issuer, ok := s.TrustBundle.(interface{ AddObserver(authority.Observer) }); ok {
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

// RunOnce loads every source once and builds the first snapshot. The
// Secret of --tls-secret or --ca-secret is read again, with backoff, until
// it loads or --startup-timeout has passed (an API server that does not
// answer yet, a Secret not created yet); then RunOnce fails naming the
// flag and the last error (the connection refused, say). It also fails
// if nothing can be served, if --client-ca-file cannot be loaded (a missing
// file, a directory, content that is not a PEM CA bundle: no client
// certificate could ever be verified, so the server must not start as if
// it could; the error names the flag and the file), or if --ca-bundle-file
// cannot be written; a failed RunOnce also stops sending Events, as Run's
// end does. Another source that fails alone (an SNI file that does
// not exist yet) is logged and retried by Run. Call it before Run when
// start-up must fail fast; Serve does.
func (s *Serving) RunOnce(ctx context.Context) (err error) {
	logger := klog.FromContext(ctx)
	s.events.start(logger)
	defer func() {
		if err != nil {
			s.events.stop() // start-up failed: Run is not to follow
		}
	}()
	for _, r := range s.runners {
		if r == s.apiSource {
			if err := s.loadFromAPI(ctx, r); err != nil {
				return err
			}
			continue
		}
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
	s.events.start(klog.FromContext(ctx))
	// Deferred calls run last-in first-out: every provider has stopped
	// (no more Events) before the sink stops.
	defer s.events.stop()
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

// loadFromAPI runs RunOnce of src, the source of --tls-secret or
// --ca-secret, until it succeeds, retrying with backoff (internal/backoff)
// on the Options' clock, and gives up once --startup-timeout has passed
// since the first attempt, with an error naming the flag, the timeout and
// the last failure. An attempt still waiting for the API server at the
// deadline is cancelled. It logs when it starts waiting and when the cause
// changes, not at every retry; src reports each failure itself too.
func (s *Serving) loadFromAPI(ctx context.Context, src dynamiccertificates.ControllerRunner) error {
	logger := klog.FromContext(ctx)
	clk, timeout := s.opts.Clock, s.opts.StartupTimeout
	ctx, cancel := context.WithCancel(ctx)
	expired := make(chan struct{})
	deadline := clk.NewTimer(timeout)
	var wg sync.WaitGroup
	// Deferred calls run last-in first-out: cancel, then wait.
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		defer deadline.Stop()
		select {
		case <-deadline.C():
			close(expired)
			cancel() // an attempt still waiting for the API server
		case <-ctx.Done():
		}
	})
	var waiting errlog.Once
	b := backoff.New(0, 0)
	var last error
	giveUp := func() error {
		if last == nil {
			last = errors.New("no attempt finished") // a deadline shorter than the first attempt
		}
		return fmt.Errorf("%s: not loaded within --startup-timeout (%v): %w", s.apiFlag, timeout, last)
	}
	for {
		select {
		case <-expired:
			return giveUp()
		default:
		}
		err := src.RunOnce(ctx)
		if err == nil {
			if last != nil {
				logger.Info("Loaded the serving certificate after waiting", "source", s.apiFlag)
			}
			return nil
		}
		if ctx.Err() != nil {
			select {
			case <-expired:
				if last == nil {
					last = err // the first attempt, cut short at the deadline
				}
				return giveUp()
			default:
				return ctx.Err() // the caller's context ended: a shutdown
			}
		}
		last = err
		delay := b.Next(err)
		waiting.Error(logger, err, "Start-up: cannot load the serving certificate yet; retrying with backoff until --startup-timeout",
			"source", s.apiFlag, "startupTimeout", timeout, "retryIn", delay)
		t := clk.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C():
		}
	}
}
