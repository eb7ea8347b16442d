package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/podcert"
	"github.com/evercert/evercert/server"
)

const userAgent = "evercert-example-signer"

// reportingController names the signer in the Events it sends.
const reportingController = "evercert.io/example-signer"

// Signer is the example signer: a podcert.Signer on the Authority of
// --ca-secret, and an HTTPS server (server.Serving) for its health and
// metrics.
type Signer struct {
	opts        *Options
	serving     *server.Serving
	authority   *authority.Authority
	signer      *podcert.Signer
	publisher   *cabundle.Publisher // nil without --cluster-trust-bundle
	broadcaster events.EventBroadcaster
	handler     http.Handler
	ready       chan struct{}
}

// New validates opts and builds the signer. Nothing runs until Run.
func New(opts *Options) (*Signer, error) {
	if errs := opts.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	policy, err := opts.policy()
	if err != nil {
		return nil, err
	}
	serving, err := opts.Build()
	if err != nil {
		return nil, err
	}
	authority, ok := serving.TrustBundle.(*authority.Authority)
	if !ok {
		return nil, errors.New("--ca-secret: the signer's CA must be an Authority")
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	restConfig.QPS, restConfig.Burst = opts.KubeAPIQPS, opts.KubeAPIBurst
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(restConfig, userAgent))
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	signer, err := podcert.NewSigner(podcert.SignerConfig{
		SignerName: opts.SignerName, CA: authority, Client: client, Policy: policy,
		KeyTypes: opts.KeyTypes, MaxLifetime: opts.MaxLifetime, Clock: opts.Clock,
		EventRecorder: broadcaster.NewRecorder(scheme.Scheme, reportingController),
	})
	if errors.Is(err, podcert.ErrCANeverCoversMinLifetime) {
		cfg := authority.Config()
		return nil, fmt.Errorf("--ca-validity %v, --ca-renew-before %v, --ca-propagation-delay %v (0 means their defaults; these are the values in effect): %w",
			cfg.CALifetime, cfg.CARenewBefore, cfg.PropagationDelay, err)
	}
	if err != nil {
		return nil, err
	}
	s := &Signer{opts: opts, serving: serving, authority: authority, signer: signer, broadcaster: broadcaster, ready: make(chan struct{})}
	// A request that waits for the CA fails readiness, naming it.
	checks := []healthz.HealthChecker{signer.HealthCheck()}
	if opts.ClusterTrustBundle != "" {
		// The bundle pods and webhooks trust, kept through rotations; an
		// observer of the Authority, so a successor CA signs only once the
		// ClusterTrustBundle holds it. It is verified against the leaf this
		// replica serves, signed by the same CA as the pods' leaves.
		s.publisher, err = cabundle.NewPublisher(cabundle.PublisherConfig{
			Source: authority, KubeClient: client, Clock: opts.Clock, Name: "clustertrustbundle",
			Targets: []cabundle.Target{{
				Kind: cabundle.ClusterTrustBundle, SignerName: opts.SignerName,
				Name: cabundle.ClusterTrustBundleName(opts.SignerName, opts.ClusterTrustBundle),
			}},
			Verify:        []dynamiccert.ServedChainLister{authority},
			EventRecorder: broadcaster.NewRecorder(scheme.Scheme, reportingController),
		})
		if err != nil {
			return nil, fmt.Errorf("--cluster-trust-bundle: %w", err)
		}
		authority.AddObserver(s.publisher)
		checks = append(checks, s.publisher.HealthCheck())
	}
	mux := http.NewServeMux()
	serving.InstallHandlersWithChecks(mux, server.HealthChecks{Readiness: append(checks,
		healthz.NamedCheck("podcert-signer", func(*http.Request) error {
			select {
			case <-s.ready:
				return nil
			default:
				return fmt.Errorf("signer %s: the requests are not listed yet, or the CA is not loaded", opts.SignerName)
			}
		}),
	)})
	s.handler = mux
	return s, nil
}

// Handler returns the HTTP handler: health checks and /metrics.
func (s *Signer) Handler() http.Handler { return s.handler }

// Ready is closed once the requests are listed, the CA is loaded and (with
// --cluster-trust-bundle) published into the ClusterTrustBundle.
func (s *Signer) Ready() <-chan struct{} { return s.ready }

// Listening is closed once the server listens; Addr then says where.
func (s *Signer) Listening() <-chan struct{} { return s.serving.Listening() }

// Addr returns the address the server listens on, once Listening is closed.
func (s *Signer) Addr() net.Addr { return s.serving.Addr() }

// CABundle returns the bundle clients of the pods should trust now.
func (s *Signer) CABundle() []byte { return s.authority.CurrentCABundleContent() }

// Authority returns the CA the signer signs with.
func (s *Signer) Authority() *authority.Authority { return s.authority }

// Run signs, rotates the CA and serves until ctx is done. It returns nil
// after a clean shutdown, and a start-up error (no CA, the port in use) at
// once, after stopping everything it started.
func (s *Signer) Run(ctx context.Context) error {
	// Deferred calls run last-in first-out: cancel, wait for every
	// goroutine (the signer records Events), then stop the broadcaster.
	defer s.broadcaster.Shutdown()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	if err := s.broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return fmt.Errorf("starting the event broadcaster: %w", err)
	}
	wg.Go(func() { s.signer.Run(ctx, s.opts.Workers) })
	if s.publisher != nil {
		wg.Go(func() { s.publisher.Run(ctx, 0) })
	}
	wg.Go(func() {
		// Ready once the requests are listed and the CA is loaded (the
		// server has its first certificate, signed by it).
		if !cache.WaitForCacheSync(ctx.Done(), s.signer.HasSynced, s.serving.HasSynced) {
			return
		}
		if s.publisher != nil && !cache.WaitForCacheSync(ctx.Done(), s.publisher.HasSynced) {
			return
		}
		klog.InfoS("PodCertificateRequest signer ready", "signer", s.opts.SignerName, "caSecret", s.opts.CASecret)
		close(s.ready)
	})
	return s.serving.Serve(ctx, s.handler)
}
