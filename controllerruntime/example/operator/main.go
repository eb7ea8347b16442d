// Command operator is a sample kubebuilder-style operator: a
// controller-runtime manager serving a CRD's conversion webhook
// (widgets.example.evercert.io, v1 hub and v2 spoke) and a validating and
// a mutating webhook for it, with health probes and metrics. Its
// certificates come from one call, evercert.Add (between the
// "evercert:begin" and "evercert:end" markers): every replica serves its
// own leaf from a CA kept in a Secret, and the webhook configurations and
// the CRD receive the CA bundle. controllerruntime/example/certcontroller
// is the same operator wired with OPA cert-controller, for comparison; the
// README counts the lines of both.
//
// controllerruntime/e2e runs three replicas of it against a real
// kube-apiserver through CA rotations (make test-operator-e2e). See
// docs/architecture.md.
package main

import (
	"crypto/tls"
	"flag"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/evercert/evercert/authority"
	evercert "github.com/evercert/evercert/controllerruntime"
	examplev1 "github.com/evercert/evercert/controllerruntime/example/operator/api/v1"
	examplev2 "github.com/evercert/evercert/controllerruntime/example/operator/api/v2"
	"github.com/evercert/evercert/controllerruntime/example/operator/webhooks"
)

// Names of the objects the operator's certificates are wired to; the
// manifests in config/ use the same.
const (
	caSecretName          = "widget-operator-ca"
	serviceName           = "widget-operator-webhook-service"
	validatingWebhookName = "widget-operator-validating-webhook-configuration"
	mutatingWebhookName   = "widget-operator-mutating-webhook-configuration"
	crdName               = "widgets.example.evercert.io"
)

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
	utilruntime.Must(examplev2.AddToScheme(scheme))
}

func main() {
	var (
		metricsAddr, probeAddr, webhookHost, namespace, certHosts, replicaID string
		enableLeaderElection, enableHTTP2                                    bool
		webhookPort                                                          int
		certLifetime, caLifetime                                             time.Duration
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "The address the metrics endpoint binds to. Use :8080 for HTTP, or leave as 0 to disable the metrics service.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "The address the probe endpoint binds to.")
	flag.BoolVar(&enableLeaderElection, "leader-elect", false, "Enable leader election for controller manager. The webhooks and their certificates run on every replica either way.")
	flag.BoolVar(&enableHTTP2, "enable-http2", false, "If set, HTTP/2 will be enabled for the metrics and webhook servers")
	flag.StringVar(&webhookHost, "webhook-host", "", "The address the webhook server binds to (empty: all).")
	flag.IntVar(&webhookPort, "webhook-port", webhook.DefaultPort, "The port the webhook server listens on.")
	flag.StringVar(&namespace, "namespace", os.Getenv("POD_NAMESPACE"), "The namespace of the CA Secret and the webhook Service (default $POD_NAMESPACE).")
	flag.StringVar(&certHosts, "webhook-cert-hosts", "", "Comma-separated DNS names and IPs of the serving certificate (default: the names of the webhook Service).")
	flag.DurationVar(&certLifetime, "cert-lifetime", 0, "Lifetime of each replica's serving certificate (0: evercert's default, 7 days).")
	flag.DurationVar(&caLifetime, "ca-lifetime", 0, "Lifetime of each CA (0: evercert's default, 8 times --cert-lifetime).")
	flag.StringVar(&replicaID, "replica-id", os.Getenv("POD_NAME"), "The name of this replica in its Lease and in logs (default $POD_NAME, else the host name with a random suffix).")
	opts := zap.Options{Development: true}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	if namespace == "" {
		setupLog.Error(nil, "--namespace is required (or set POD_NAMESPACE)")
		os.Exit(1)
	}

	// HTTP/2 stays off (CVE-2023-44487, CVE-2023-39325), as kubebuilder
	// scaffolds it.
	var tlsOpts []func(*tls.Config)
	if !enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr, TLSOpts: tlsOpts},
		WebhookServer:          webhook.NewServer(webhook.Options{Host: webhookHost, Port: webhookPort, TLSOpts: tlsOpts}),
		HealthProbeBindAddress: probeAddr,
		LeaderElection:         enableLeaderElection,
		LeaderElectionID:       "widget-operator.example.evercert.io",
	})
	if err != nil {
		setupLog.Error(err, "unable to start manager")
		os.Exit(1)
	}

	var hosts []string
	if certHosts != "" {
		hosts = strings.Split(certHosts, ",")
	}
	// evercert:begin
	if _, err := evercert.Add(mgr, evercert.Config{
		Namespace: namespace, SecretName: caSecretName, ServiceName: serviceName, Hosts: hosts,
		Authority:          authority.Config{Lifetime: certLifetime, CALifetime: caLifetime, ReplicaID: replicaID},
		ValidatingWebhooks: []string{validatingWebhookName}, MutatingWebhooks: []string{mutatingWebhookName}, CRDs: []string{crdName},
	}); err != nil {
		setupLog.Error(err, "unable to set up the webhook certificates")
		os.Exit(1)
	}
	// evercert:end

	setupWebhooks(mgr, replicaID)
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up ready check")
		os.Exit(1)
	}

	setupLog.Info("starting manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		setupLog.Error(err, "problem running manager")
		os.Exit(1)
	}
}

// setupWebhooks registers the Widget webhooks (admission and conversion)
// with the manager's webhook server, or exits.
func setupWebhooks(mgr ctrl.Manager, replicaID string) {
	if err := webhooks.SetupWidgetWebhookWithManager(mgr, replicaID); err != nil {
		setupLog.Error(err, "unable to create webhook", "webhook", "Widget")
		os.Exit(1)
	}
}
