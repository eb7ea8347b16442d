package cabundle

import (
	"bytes"
	"context"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
)

func ctbFixture(name, signer string, bundle []byte) *certificatesv1.ClusterTrustBundle {
	return &certificatesv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: string(bundle)},
	}
}

// TestClusterTrustBundleSourceFeedsPublisher: the source merges the
// bundles of its signer only (deduplicated, stable order), and a Publisher
// with it as Source keeps a webhook's caBundle equal to it as bundles are
// added and deleted.
func TestClusterTrustBundleSourceFeedsPublisher(t *testing.T) {
	const signer = "example.com/platform"
	a, b, other := newBundle(t, "a"), newBundle(t, "b"), newBundle(t, "other")
	ab := append(append([]byte{}, a...), b...)
	kube := kubefake.NewClientset(
		// b:1 holds a and b; a:0 holds a again (a duplicate across
		// bundles); another signer's bundle is left out.
		ctbFixture("example.com:platform:b1", signer, ab),
		ctbFixture("example.com:platform:a0", signer, a),
		ctbFixture("other.io:x:y", "other.io/x", other),
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "vwc"},
			Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "w.example.com"}},
		},
	)
	src, err := NewClusterTrustBundleSource(kube, signer)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { src.Run(ctx, 1); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, 5*time.Second, "merged bundle", func() bool { return bytes.Equal(src.CurrentCABundleContent(), ab) })
	if _, ok := src.VerifyOptions(); !ok {
		t.Error("VerifyOptions not ok with a bundle")
	}

	p, err := NewPublisher(PublisherConfig{Source: src, KubeClient: kube,
		Targets: []Target{{Kind: ValidatingWebhookConfiguration, Name: "vwc"}}})
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	waitReady(t, p, 10*time.Second)
	vwcs := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	caBundle := func() []byte {
		o, err := vwcs.Get(context.Background(), "vwc", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return o.Webhooks[0].ClientConfig.CABundle
	}
	if !bytes.Equal(caBundle(), ab) {
		t.Fatalf("caBundle is not the merged bundle")
	}

	// The signer rotates: a new bundle appears, an old one goes.
	c := newBundle(t, "c")
	ctbs := kube.CertificatesV1().ClusterTrustBundles()
	if _, err := ctbs.Create(context.Background(), ctbFixture("example.com:platform:c2", signer, c), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ctbs.Delete(context.Background(), "example.com:platform:b1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, a...), c...)
	eventually(t, 5*time.Second, "caBundle follows the signer's bundles", func() bool { return bytes.Equal(caBundle(), want) })
}
