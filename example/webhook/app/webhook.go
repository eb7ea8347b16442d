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
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/server"
)

const userAgent = "evercert-example-webhook"

// Webhook is the admission webhook: an HTTPS server (server.Serving, with the
// CA of --ca-secret) serving the Rule on ValidatePath and MutatePath, a
// cabundle.Publisher keeping the configurations' caBundle equal to the CA
// bundle, and, with --register-url, the registration of the configurations.
type Webhook struct {
	opts      *Options
	serving   *server.Serving
	publisher *cabundle.Publisher
	client    kubernetes.Interface
	handler   http.Handler

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
	if serving.TrustBundle == nil {
		return nil, errors.New("--ca-secret: the serving certificate has no CA bundle to publish")
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(restConfig, userAgent))
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	svc, _ := opts.serviceRef() // validated above
	var targets []cabundle.Target
	if opts.ValidatingWebhookConfiguration != "" {
		targets = append(targets, cabundle.Target{Kind: cabundle.ValidatingWebhookConfiguration, Name: opts.ValidatingWebhookConfiguration, Service: svc})
	}
	if opts.MutatingWebhookConfiguration != "" {
		targets = append(targets, cabundle.Target{Kind: cabundle.MutatingWebhookConfiguration, Name: opts.MutatingWebhookConfiguration, Service: svc})
	}
	publisher, err := cabundle.NewPublisher(cabundle.PublisherConfig{Source: serving.TrustBundle, Targets: targets, KubeClient: client, Clock: opts.Clock})
	if err != nil {
		return nil, err
	}
	// Observed rotation: a successor CA signs only once the API server,
	// read back, holds it in every caBundle this replica publishes.
	if issuer, ok := serving.TrustBundle.(interface{ AddObserver(dynamiccert.Observer) }); ok {
		issuer.AddObserver(publisher)
	}
	w := &Webhook{opts: opts, serving: serving, publisher: publisher, client: client, registered: make(chan struct{}), ready: make(chan struct{})}
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
func (w *Webhook) CABundle() []byte { return w.serving.TrustBundle.CurrentCABundleContent() }

// Run serves, publishes and (with --register-url) registers until ctx is
// done. It returns nil after a clean shutdown, and a start-up error (no CA,
// the port in use) at once, after stopping everything it started.
func (w *Webhook) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Deferred calls run last-in first-out: cancel, then wait.
	defer wg.Wait()
	defer cancel()

	wg.Go(func() { w.publisher.Run(ctx, 0) })
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
