package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
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
	"github.com/evercert/evercert/server"
)

const userAgent = "evercert-example-webhook"

// reportingController names the webhook in the Events it sends.
const reportingController = "evercert.io/example-webhook"

// Webhook is the admission webhook: an HTTPS server (server.Serving, with the
// CA of --ca-secret) serving the Rule on ValidatePath and MutatePath, a
// cabundle.Publisher keeping the configurations' caBundle equal to the CA
// bundle, and, with --register-url, the registration of the configurations.
type Webhook struct {
	opts      *Options
	serving   *server.Serving
	publisher *cabundle.Publisher
	// source is the caBundle published: --ca-secret's CA, or the
	// ClusterTrustBundles of --ca-from-signer (then also signerBundles).
	source        dynamiccertificates.CAContentProvider
	signerBundles *cabundle.ClusterTrustBundleSource
	client        kubernetes.Interface
	handler       http.Handler
	// broadcaster sends the publisher's Events (contested, unverified).
	broadcaster events.EventBroadcaster

	// registered is closed once the configurations are registered (at
	// once without --register-url); ready once, in addition, the caBundle
	// is published to every configuration.
	registered, ready chan struct{}
}

// New validates opts and builds the webhook. Nothing runs until Run.
func New(opts *Options) (*Webhook, error) {
	if errs := opts.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	serving, err := opts.Build()
	if err != nil {
		return nil, err
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(restConfig, userAgent))
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	source := serving.TrustBundle
	var signerBundles *cabundle.ClusterTrustBundleSource
	var verify []dynamiccert.ServedChainLister
	if opts.CAFromSigner != "" {
		if signerBundles, err = cabundle.NewClusterTrustBundleSource(client, opts.CAFromSigner); err != nil {
			return nil, fmt.Errorf("--ca-from-signer: %w", err)
		}
		source = signerBundles
		// The API server verifies the served certificate with what is
		// published: check that it does, and say so when it stops.
		verify = []dynamiccert.ServedChainLister{dynamiccert.ServedBy(serving.Serving)}
	}
	if source == nil {
		return nil, errors.New("--ca-secret: the serving certificate has no CA bundle to publish")
	}
	svc, _ := opts.serviceRef() // validated above
	var targets []cabundle.Target
	if opts.ValidatingWebhookConfiguration != "" {
		targets = append(targets, cabundle.Target{Kind: cabundle.ValidatingWebhookConfiguration, Name: opts.ValidatingWebhookConfiguration, Service: svc})
	}
	if opts.MutatingWebhookConfiguration != "" {
		targets = append(targets, cabundle.Target{Kind: cabundle.MutatingWebhookConfiguration, Name: opts.MutatingWebhookConfiguration, Service: svc})
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	publisher, err := cabundle.NewPublisher(cabundle.PublisherConfig{Source: source, Targets: targets, KubeClient: client, Clock: opts.Clock,
		Verify: verify, EventRecorder: broadcaster.NewRecorder(scheme.Scheme, reportingController)})
	if err != nil {
		return nil, err
	}
	// Observed rotation: a successor CA signs only once the API server,
	// read back, holds it in every caBundle this replica publishes.
	if issuer, ok := serving.TrustBundle.(interface{ AddObserver(authority.Observer) }); ok {
		issuer.AddObserver(publisher)
	}
	w := &Webhook{opts: opts, serving: serving, publisher: publisher, source: source, signerBundles: signerBundles, broadcaster: broadcaster,
		client: client, registered: make(chan struct{}), ready: make(chan struct{})}
	if opts.RegisterURL == "" {
		close(w.registered)
	}
	w.handler = w.newHandler()
	return w, nil
}

// newHandler routes the admission paths, the health endpoints and /metrics
// (server.Serving.InstallHandlersWithChecks). The readiness check
// "cabundle-published" waits for the configurations to be registered (with
// --register-url) and their caBundle published: until then the API server
// could not call or verify the webhook, so it is not ready for traffic. It
// is on /readyz and /healthz but not on /livez: a webhook that cannot
// publish (RBAC, say) is broken, not dead, and a restart would not help.
func (w *Webhook) newHandler() http.Handler {
	rule := Rule{Namespace: w.opts.TargetNamespace}
	mux := http.NewServeMux()
	w.serving.InstallHandlersWithChecks(mux, server.HealthChecks{Readiness: []healthz.HealthChecker{
		w.publisher.HealthCheck(),
		healthz.NamedCheck("cabundle-published", func(*http.Request) error {
			select {
			case <-w.registered:
			default:
				return errors.New("the webhook configurations are not registered yet")
			}
			if !w.publisher.HasSynced() {
				return errors.New("the caBundle is not yet published to every webhook configuration")
			}
			return nil
		}),
	}})
	mux.Handle(ValidatePath, AdmissionHandler("validate", rule.Validate))
	mux.Handle(MutatePath, AdmissionHandler("mutate", rule.Mutate))
	return mux
}

// Handler returns the webhook's HTTP handler (admission, health, metrics).
func (w *Webhook) Handler() http.Handler { return w.handler }

// Ready is closed once Run has published the caBundle to every configured
// webhook configuration and, with --register-url, registered them.
func (w *Webhook) Ready() <-chan struct{} { return w.ready }

// Listening is closed once the server listens; Addr then says where.
func (w *Webhook) Listening() <-chan struct{} { return w.serving.Listening() }

// Addr returns the address the server listens on, once Listening is closed.
func (w *Webhook) Addr() net.Addr { return w.serving.Addr() }

// CABundle returns the CA bundle the webhook publishes now.
func (w *Webhook) CABundle() []byte { return w.source.CurrentCABundleContent() }

// HealthCheck returns the readiness check of the caBundle publisher: it
// fails while the caBundle is not published, contested, or (with
// --ca-from-signer) does not verify the served certificate.
func (w *Webhook) HealthCheck() healthz.HealthChecker { return w.publisher.HealthCheck() }

// Run serves, publishes and (with --register-url) registers until ctx is
// done. It returns nil after a clean shutdown, and a start-up error (no CA,
// the port in use) at once, after stopping everything it started.
func (w *Webhook) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// Deferred calls run last-in first-out: cancel, wait for every
	// goroutine (the publisher records Events), then stop the broadcaster.
	defer w.broadcaster.Shutdown()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	wg.Go(func() { w.publisher.Run(ctx, 0) })
	if err := w.broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return fmt.Errorf("starting the event broadcaster: %w", err)
	}
	if w.signerBundles != nil {
		wg.Go(func() { w.signerBundles.Run(ctx, 1) })
	}

	wg.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-w.registered:
		}
		if !cache.WaitForCacheSync(ctx.Done(), w.publisher.HasSynced) {
			return
		}
		logger.Info("Admission webhook ready: caBundle published")
		close(w.ready)
	})
	wg.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-w.Listening():
		}
		logger.Info("Admission webhook listening", "address", w.Addr().String(), "validate", ValidatePath, "mutate", MutatePath,
			"validatingWebhookConfiguration", w.opts.ValidatingWebhookConfiguration, "mutatingWebhookConfiguration", w.opts.MutatingWebhookConfiguration)
		if w.opts.RegisterURL == "" {
			return
		}
		base, err := w.opts.registerBase(w.Addr())
		if err != nil {
			logger.Error(err, "--register-url: not registering")
			return
		}
		reg := Registration{BaseURL: base, Validating: w.opts.ValidatingWebhookConfiguration, Mutating: w.opts.MutatingWebhookConfiguration, Namespace: w.opts.TargetNamespace}
		if reg.registerUntilDone(ctx, w.client, w.CABundle) {
			close(w.registered)
		}
	})
	return w.serving.Serve(ctx, w.handler)
}
