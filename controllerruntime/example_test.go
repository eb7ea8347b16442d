package controllerruntime_test

import (
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/evercert/evercert/authority"
	evercert "github.com/evercert/evercert/controllerruntime"
	"github.com/evercert/evercert/dynamiccert"
)

// The functions below hold the README's "controller-runtime: one call"
// recipes line for line; TestREADMERecipesAreCompiled checks that each Go
// block of that README section appears here verbatim, so the README cannot
// drift from code that compiles.

// run is the README's first recipe: a kubebuilder-style main.
func run() error {
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{HealthProbeBindAddress: ":8081"})
	if err != nil {
		return err
	}
	certs, err := evercert.Add(mgr, evercert.Config{
		Namespace: "my-operator-system", SecretName: "my-operator-ca", ServiceName: "my-operator-webhook",
		ValidatingWebhooks: []string{"my-operator"}, MutatingWebhooks: []string{"my-operator"},
		CRDs: []string{"widgets.example.com"},
	})
	if err != nil {
		return err
	}
	// Optional, cert-controller style: register the webhooks once a certificate
	// is served and every caBundle holds the CA (the readiness check waits anyway).
	go func() { <-certs.Ready(); setupWebhooks(mgr) }()
	return mgr.Start(ctrl.SetupSignalHandler())
}

// addSelfSigned is the README's Source recipe.
func addSelfSigned(mgr ctrl.Manager) (*evercert.Certs, error) {
	selfSigned, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Hosts: []string{"my-operator-webhook.my-operator-system.svc"},
	})
	if err != nil {
		return nil, err
	}
	return evercert.Add(mgr, evercert.Config{Source: selfSigned, CABundle: selfSigned, ValidatingWebhooks: []string{"my-operator"}})
}

// addFiles is the README's File recipe (cert-manager or the kubelet writes
// the files).
func addFiles(mgr ctrl.Manager) (*evercert.Certs, error) {
	serving, err := dynamiccert.NewFileCertKey(dynamiccert.FileCertKeyConfig{CertFile: "/certs/tls.crt", KeyFile: "/certs/tls.key"})
	if err != nil {
		return nil, err
	}
	ca, err := dynamiccert.NewFileCA(dynamiccert.FileCAConfig{File: "/certs/ca.crt"})
	if err != nil {
		return nil, err
	}
	return evercert.Add(mgr, evercert.Config{Source: serving, CABundle: ca, ValidatingWebhooks: []string{"my-operator"}})
}

func setupWebhooks(ctrl.Manager) {}

// Example shows the one call in a kubebuilder-style main (compiled, not
// run: it needs a cluster).
func Example() {
	_ = run
	_, _ = addSelfSigned, addFiles
}
