package controllerruntime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
	evercertmetrics "github.com/evercert/evercert/metrics"
	"github.com/evercert/evercert/sni"
)

// userAgent is added to the manager's rest.Config for evercert's requests,
// so they can be told apart in the API server's audit log and metrics.
const userAgent = "evercert-controllerruntime"

// recorderName is the reportingController of the Events evercert sends
// through the manager's events.k8s.io recorder.
const recorderName = "evercert"

// Add wires everything into mgr as Runnables with NeedLeaderElection()
// false (every replica serves its own leaf, whether it leads or not): the
// source (an Authority keeping its CA in the Secret Namespace/SecretName by
// default, or Config.Source), the cabundle.Publisher that keeps the CA
// bundle in every target, and the sni controller that serves the leaf. Their
// Run loops get mgr's logger (named "evercert") in their context; some
// provider messages go to klog's global logger, so route klog to the
// manager's logger (klog.SetLogger(mgr.GetLogger())) to have every line in
// one place. They send Events through mgr's events.k8s.io recorder and
// share mgr's HTTP client.
//
// When mgr.GetWebhookServer() is a *webhook.DefaultServer (the default), Add
// appends TLSOpts() to its Options.TLSOpts, so the webhook server (admission
// and conversion webhooks) serves evercert's certificate with no other line;
// the server's other options (ClientCAName, MinVersion, NextProtos) stay in
// force. Add does not call GetWebhookServer (which would create and start a
// server) when every target is an APIService: an aggregated API server uses
// TLSOpts() itself.
//
// Add registers HealthzCheck and ReadyzCheck on mgr under CheckName
// ("evercert"). It must be called before mgr.Start; after, it returns an
// error and changes nothing. It may be called once per manager: a second
// call returns an error and changes nothing (the manager would silently
// replace the first call's checks with the second's, and its webhook server
// would serve the second call's leaf while the first call's publisher
// keeps its own CA in the first call's targets). A bad Config is an error
// naming the field. Add is safe for concurrent use.
//
// Add registers evercert's metrics (evercert_*) in controller-runtime's
// metrics.Registry, which the manager's metrics server serves, once per
// process: a later Add (another manager) or a caller that registered
// evercert's metrics.Collector there already finds them registered.
func Add(mgr manager.Manager, cfg Config) (*Certs, error) {
	c, err := add(mgr, cfg)
	if err != nil {
		return nil, fmt.Errorf("evercert controllerruntime.Add: %w", err)
	}
	return c, nil
}

func add(mgr manager.Manager, cfg Config) (*Certs, error) {
	if mgr == nil {
		return nil, errors.New("the manager is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if !claim(mgr) {
		return nil, fmt.Errorf("already called on this manager: call it once, with every target in one Config (its checks are named %q)", CheckName)
	}
	if err := registerMetrics(); err != nil {
		release(mgr)
		return nil, err
	}
	c, err := wire(mgr, cfg)
	if err != nil {
		release(mgr)
		return nil, err
	}
	return c, nil
}

// registerMetrics registers evercert's metrics in controller-runtime's
// metrics.Registry: evercert registers them in component-base's
// legacyregistry, which a manager does not serve. The Registry is one per
// process and every manager serves it, so once is enough; a registration
// already there (a second Add, or the caller's own) is the one wanted.
func registerMetrics() error {
	err := ctrlmetrics.Registry.Register(evercertmetrics.Collector())
	var already prometheus.AlreadyRegisteredError
	if err != nil && !errors.As(err, &already) {
		return fmt.Errorf("registering evercert's metrics in controller-runtime's metrics.Registry: %w", err)
	}
	return nil
}

// claimed holds the managers Add has wired (manager.Manager to struct{}).
// An entry stays for the life of the process; a process has few managers.
var claimed sync.Map

// claim records that Add wires mgr, and reports false when it already has.
// A manager whose dynamic type is not comparable cannot be recorded; it is
// always claimed (controller-runtime's own manager is a pointer).
func claim(mgr manager.Manager) (ok bool) {
	defer func() {
		if recover() != nil { // incomparable dynamic type
			ok = true
		}
	}()
	_, loaded := claimed.LoadOrStore(mgr, struct{}{})
	return !loaded
}

// release undoes claim after a refused Add, so that the caller may retry.
func release(mgr manager.Manager) {
	defer func() { _ = recover() }() // incomparable dynamic type: never stored
	claimed.Delete(mgr)
}

// wire builds and adds everything for add, which has validated cfg.
func wire(mgr manager.Manager, cfg Config) (*Certs, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	restConfig := rest.AddUserAgent(rest.CopyConfig(mgr.GetConfig()), userAgent)
	httpClient := mgr.GetHTTPClient()
	kube, err := kubernetes.NewForConfigAndClient(restConfig, httpClient)
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes client from the manager's config: %w", err)
	}
	recorder := mgr.GetEventRecorder(recorderName)

	c := &Certs{clock: cfg.Clock, ready: make(chan struct{})}
	var runs []namedRun
	source, bundle := cfg.Source, cfg.CABundle
	if source == nil {
		ac := cfg.Authority
		ac.Namespace, ac.SecretName = cfg.Namespace, cfg.SecretName
		if len(ac.Hosts) == 0 {
			ac.Hosts = cfg.hosts()
		}
		if ac.Client == nil {
			ac.Client = kube
		}
		if ac.EventRecorder == nil {
			ac.EventRecorder = recorder
		}
		if ac.Clock == nil {
			ac.Clock = cfg.Clock
		}
		if ac.ReplicaID == "" {
			// The pod's name: stable across restarts of the process, so a
			// restarted replica takes over its own Lease at once.
			ac.ReplicaID = strings.TrimSpace(os.Getenv(authority.PodNameEnv))
		}
		ca, err := authority.New(ac)
		if err != nil {
			return nil, fmt.Errorf("Config.Authority: %w", err)
		}
		source = ca
		if bundle == nil {
			bundle = ca
		}
		c.rotation = ca
	} else if r, ok := source.(authority.RotationReporter); ok {
		c.rotation = r
	}
	c.source = source
	if r, ok := source.(runner); ok {
		runs = append(runs, namedRun{"source", func(ctx context.Context) { r.Run(ctx, 1) }})
	}
	if r, ok := bundle.(runner); ok && !sameProvider(bundle, source) {
		runs = append(runs, namedRun{"ca-bundle", func(ctx context.Context) { r.Run(ctx, 1) }})
	}

	if targets := cfg.targets(); len(targets) > 0 {
		ext, err := apiextensionsclient.NewForConfigAndClient(restConfig, httpClient)
		if err != nil {
			return nil, fmt.Errorf("building the apiextensions client from the manager's config: %w", err)
		}
		agg, err := aggregatorclient.NewForConfigAndClient(restConfig, httpClient)
		if err != nil {
			return nil, fmt.Errorf("building the aggregator client from the manager's config: %w", err)
		}
		c.publisher, err = cabundle.NewPublisher(cabundle.PublisherConfig{
			Source: bundle, Targets: targets,
			KubeClient: kube, APIExtensionsClient: ext, AggregatorClient: agg,
			Clock: cfg.Clock, EventRecorder: recorder,
			// The readiness check then also fails while a target's
			// caBundle does not verify this replica's leaf.
			Verify: []dynamiccert.ServedChainLister{dynamiccert.ServedBy(source)},
		})
		if err != nil {
			return nil, err
		}
		runs = append(runs, namedRun{"cabundle", func(ctx context.Context) { c.publisher.Run(ctx, 0) }}) // 0: DefaultWorkers
	}

	c.ctrl, err = sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: source, Clock: cfg.Clock, Name: "evercert"})
	if err != nil {
		return nil, fmt.Errorf("the serving controller: %w", err)
	}
	runs = append(runs, namedRun{"serving", func(ctx context.Context) { c.ctrl.Run(ctx, 1) }}, namedRun{"ready", c.waitReady})

	// The checks first: controller-runtime refuses them once the manager
	// has started, so nothing else is changed by a late call.
	if err := mgr.AddHealthzCheck(CheckName, c.HealthzCheck()); err != nil {
		return nil, fmt.Errorf("adding the health check %q (call Add before the manager starts): %w", CheckName, err)
	}
	if err := mgr.AddReadyzCheck(CheckName, c.ReadyzCheck()); err != nil {
		return nil, fmt.Errorf("adding the ready check %q (call Add before the manager starts): %w", CheckName, err)
	}
	if c.publisher != nil {
		// Observed rotation: a successor CA signs only once every target,
		// read back from the API server, holds it. Only now that the
		// manager took the checks (it refuses them once started, and then
		// would never run the publisher): an observer that never syncs
		// would hold back every successor of the caller's provider until
		// its signing CA is about to expire.
		if o, ok := bundle.(interface{ AddObserver(authority.Observer) }); ok {
			o.AddObserver(c.publisher)
		}
	}
	logger := mgr.GetLogger().WithName("evercert")
	for _, r := range runs {
		if err := mgr.Add(everyReplica{name: r.name, logger: logger, run: r.run}); err != nil {
			return nil, fmt.Errorf("adding the %s runnable: %w", r.name, err)
		}
	}
	if !onlyAPIServices(cfg.targets()) {
		if ws, ok := mgr.GetWebhookServer().(*webhook.DefaultServer); ok {
			ws.Options.TLSOpts = append(ws.Options.TLSOpts, c.TLSOpts())
		}
	}
	return c, nil
}

// namedRun is a Run loop and the name its Runnable logs under.
type namedRun struct {
	name string
	run  func(ctx context.Context)
}

// everyReplica is a manager Runnable that runs on every replica, leader or
// not, until the manager stops. Its Run loop logs through the manager's
// logger, passed in the context.
type everyReplica struct {
	name   string
	logger klog.Logger
	run    func(ctx context.Context)
}

var (
	_ manager.Runnable               = everyReplica{}
	_ manager.LeaderElectionRunnable = everyReplica{}
)

// Start runs the loop until ctx is done.
func (r everyReplica) Start(ctx context.Context) error {
	r.run(klog.NewContext(ctx, r.logger.WithValues("runnable", r.name)))
	return nil
}

// NeedLeaderElection is false: each replica serves its own leaf.
func (r everyReplica) NeedLeaderElection() bool { return false }

// sameProvider reports whether bundle and source are the same object (an
// Authority or SelfSigned serving both), so it is run once.
func sameProvider(bundle, source any) (same bool) {
	defer func() {
		if recover() != nil { // incomparable dynamic types: not the same
			same = false
		}
	}()
	return bundle == source
}

// onlyAPIServices reports whether there are targets and all are
// APIServices.
func onlyAPIServices(ts []cabundle.Target) bool {
	for _, t := range ts {
		if t.Kind != cabundle.APIService {
			return false
		}
	}
	return len(ts) > 0
}
