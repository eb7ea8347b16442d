package cabundle_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/sni"
)

// serveWebhook is the README recipe "An admission webhook (Authority +
// cabundle)", word for word: an Authority, a Publisher that is also its
// Observer, and the sni controller serving a plain net/http server.
// example/webhook runs the same wiring against a real kube-apiserver
// (test/e2e).
func serveWebhook(ctx context.Context, kubeClient kubernetes.Interface, handler http.Handler) error {
	ca, err := authority.New(authority.Config{
		Namespace: "my-ns", SecretName: "my-webhook-ca", Client: kubeClient,
		Hosts: []string{"my-webhook.my-ns.svc"},
	})
	if err != nil {
		return err
	}
	publisher, err := cabundle.NewPublisher(cabundle.PublisherConfig{
		Source:     ca,
		KubeClient: kubeClient,
		Targets: []cabundle.Target{
			{Kind: cabundle.ValidatingWebhookConfiguration, Name: "my-webhook"},
			{Kind: cabundle.MutatingWebhookConfiguration, Name: "my-webhook"},
		},
		Verify: []dynamiccert.ServedChainLister{ca}, // each caBundle must verify this replica's leaf
	})
	if err != nil {
		return err
	}
	ca.AddObserver(publisher) // a successor CA signs only once every target holds it
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: ca})
	if err != nil {
		return err
	}
	go ca.Run(ctx, 1)
	go publisher.Run(ctx, 0) // 0: DefaultWorkers; publisher.HasSynced() once every target holds the bundle
	go ctrl.Run(ctx, 1)      // ready: ctrl.HasSynced() && publisher.HasSynced()
	srv := &http.Server{Addr: ":8443", Handler: handler, TLSConfig: ctrl.TLSConfig()}
	return srv.ListenAndServeTLS("", "")
}

var _ = serveWebhook

// TestREADMEWebhookRecipeIsCompiled checks that the Go block of the
// admission webhook section of docs/embedding.md is serveWebhook's body, verbatim, so
// the recipe compiles and cannot drift.
func TestREADMEWebhookRecipeIsCompiled(t *testing.T) {
	const heading = "\n### An admission webhook (Authority + cabundle)\n"
	readme, err := os.ReadFile("../docs/embedding.md")
	require.NoError(t, err)
	source, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	_, section, found := strings.Cut(string(readme), heading)
	require.True(t, found, "docs/embedding.md has no section %q", strings.TrimSpace(heading))
	_, after, found := strings.Cut(section, "```go\n")
	require.True(t, found, "the section has no Go block")
	block, _, found := strings.Cut(after, "```\n")
	require.True(t, found, "unterminated Go block")
	var body strings.Builder
	for line := range strings.Lines(block) {
		body.WriteString("\t" + line) // the function body is indented once
	}
	require.Contains(t, string(source), body.String(), "the docs/embedding.md block is not serveWebhook's body")
}
