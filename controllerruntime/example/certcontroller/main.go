// Command certcontroller is the sample operator of
// controllerruntime/example/operator with its certificates wired by OPA
// cert-controller (github.com/open-policy-agent/cert-controller) instead of
// evercert: rotator.AddRotator, the IsReady channel that holds the webhook
// registration back, and the webhook server reading the certificate from
// CertDir, where the Deployment must mount the Secret. It exists to be
// compiled and counted: docs/embedding.md compares the lines between the
// "cert-controller:begin" and "cert-controller:end" markers with those
// between evercert's markers in the operator's main.go
// (TestREADMELinesOfCode in controllerruntime/example/operator). It is its
// own module so that the controllerruntime module takes no cert-controller
// dependency. See docs/architecture.md.
package main

import (
	"crypto/tls"
	"flag"
	"os"
	"strings"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	examplev1 "github.com/evercert/evercert/controllerruntime/example/operator/api/v1"
	examplev2 "github.com/evercert/evercert/controllerruntime/example/operator/api/v2"
	"github.com/evercert/evercert/controllerruntime/example/operator/webhooks"
)

// Names of the objects the operator's certificates are wired to, as in the
// evercert operator.
const (
	caSecretName          = "widget-operator-ca"
	serviceName           = "widget-operator-webhook-service"
	validatingWebhookName = "widget-operator-validating-webhook-configuration"
	mutatingWebhookName   = "widget-operator-mutating-webhook-configuration"
	crdName               = "widgets.example.evercert.io"
	// certDir is where the Deployment mounts the Secret cert-controller
	// writes (controller-runtime's default CertDir).
	certDir = "/tmp/k8s-webhook-server/serving-certs"
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
	flag.BoolVar(&enableLeaderElection, "leader-elect", false, "Enable leader election for controller manager.")
	flag.BoolVar(&enableHTTP2, "enable-http2", false, "If set, HTTP/2 will be enabled for the metrics and webhook servers")
	flag.StringVar(&webhookHost, "webhook-host", "", "The address the webhook server binds to (empty: all).")
	flag.IntVar(&webhookPort, "webhook-port", webhook.DefaultPort, "The port the webhook server listens on.")
	flag.StringVar(&namespace, "namespace", os.Getenv("POD_NAMESPACE"), "The namespace of the certificate Secret and the webhook Service (default $POD_NAMESPACE).")
	flag.StringVar(&certHosts, "webhook-cert-hosts", "", "Comma-separated extra DNS names of the serving certificate.")
	flag.DurationVar(&certLifetime, "cert-lifetime", 0, "Lifetime of the serving certificate (0: cert-controller's default).")
	flag.DurationVar(&caLifetime, "ca-lifetime", 0, "Lifetime of the CA (0: cert-controller's default).")
	flag.StringVar(&replicaID, "replica-id", os.Getenv("POD_NAME"), "The name of this replica in logs (default $POD_NAME).")
	opts := zap.Options{Development: true}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	if namespace == "" {
		setupLog.Error(nil, "--namespace is required (or set POD_NAMESPACE)")
		os.Exit(1)
	}

	var tlsOpts []func(*tls.Config)
	if !enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	webhookOpts := webhook.Options{Host: webhookHost, Port: webhookPort, TLSOpts: tlsOpts}
	// cert-controller:begin
	webhookOpts.CertDir = certDir
	// cert-controller:end
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr, TLSOpts: tlsOpts},
		WebhookServer:          webhook.NewServer(webhookOpts),
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
	// cert-controller:begin
	setupFinished := make(chan struct{})
	if err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey: types.NamespacedName{Namespace: namespace, Name: caSecretName},
		CertDir:   certDir, CAName: "widget-operator-ca", CAOrganization: "widget-operator",
		DNSName: serviceName + "." + namespace + ".svc", ExtraDNSNames: hosts, IsReady: setupFinished,
		CaCertDuration: caLifetime, ServerCertDuration: certLifetime,
		Webhooks: []rotator.WebhookInfo{
			{Name: validatingWebhookName, Type: rotator.Validating},
			{Name: mutatingWebhookName, Type: rotator.Mutating},
			{Name: crdName, Type: rotator.CRDConversion},
		},
	}); err != nil {
		setupLog.Error(err, "unable to set up cert rotation")
		os.Exit(1)
	}
	go func() {
		<-setupFinished
		setupWebhooks(mgr, replicaID)
	}()
	// Not ready until the webhook server serves the mounted certificate.
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		setupLog.Error(err, "unable to set up the webhook ready check")
		os.Exit(1)
	}
	// cert-controller:end

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
