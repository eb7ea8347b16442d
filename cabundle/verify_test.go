package cabundle

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
)

// issuedCA returns a fresh CA and a leaf it signed, for a served chain.
func issuedCA(t *testing.T, name string) (ca, leaf *pki.Issued) {
	t.Helper()
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: name, Now: now, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err = pki.IssueLeaf(ca, pki.Request{CommonName: "server", DNSNames: []string{"svc.ns.svc"}, Now: now, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return ca, leaf
}

func verifiedGauge(t *testing.T, kind Kind, name string) float64 {
	return certmetricstest.Value(t, "evercert_cabundle_verified", map[string]string{"kind": string(kind), "name": name})
}

func unverifiedEpisodes(t *testing.T, kind Kind, name string) float64 {
	return certmetricstest.Value(t, "evercert_cabundle_unverified_total", map[string]string{"kind": string(kind), "name": name})
}

// TestVerifyDetectsWipedAndStaleBundles runs a publisher (real Run loop,
// fake clientset) that verifies its published caBundle against the chain a
// server serves, a provider whose leaf the test changes:
//   - published and read back, the bundle verifies: gauge 1, healthy;
//   - wiped by another writer (a re-apply), the read-back no longer
//     verifies: an episode is counted and a Warning Event sent before the
//     drift repair, which then brings the gauge back to 1 with a Normal
//     Event;
//   - the server serving a leaf of a CA the bundle dropped (a replica left
//     behind): gauge 0, health check failing with the object's name, until
//     the server serves a leaf of the published CA again.
func TestVerifyDetectsWipedAndStaleBundles(t *testing.T) {
	const name = "verify-vwc"
	ca1, leaf1 := issuedCA(t, "ca1")
	served := newTestServed(leaf1)
	kube := kubefake.NewClientset(&admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "w.example.com"}},
	})
	rec := &testRecorder{}
	source := newTestCA(ca1.CertPEM)
	p, err := NewPublisher(PublisherConfig{
		Source: source, KubeClient: kube, EventRecorder: rec,
		Targets: []Target{{Kind: ValidatingWebhookConfiguration, Name: name}},
		Verify:  []dynamiccert.ServedChainLister{dynamiccert.ServedBy(served)},
	})
	if err != nil {
		t.Fatal(err)
	}
	episodes := unverifiedEpisodes(t, ValidatingWebhookConfiguration, name)
	runPublisher(t, p)
	waitReady(t, p, 10*time.Second)
	eventually(t, 5*time.Second, "published bundle verified", func() bool {
		return verifiedGauge(t, ValidatingWebhookConfiguration, name) == 1 && p.HealthCheck().Check(nil) == nil
	})

	// Wiped by a re-apply: detected on the read-back, then repaired.
	vwcs := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	o, err := vwcs.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o.Webhooks[0].ClientConfig.CABundle = nil
	if _, err := vwcs.Update(context.Background(), o, metav1.UpdateOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the wipe counted as an unverified episode", func() bool {
		return unverifiedEpisodes(t, ValidatingWebhookConfiguration, name) == episodes+1
	})
	eventually(t, 5*time.Second, "repaired and verified again", func() bool {
		return verifiedGauge(t, ValidatingWebhookConfiguration, name) == 1 && p.HealthCheck().Check(nil) == nil
	})
	if w := rec.await(t, reasonUnverified); len(w) != 1 || w[0].eventtype != corev1.EventTypeWarning || w[0].name != name || !strings.Contains(w[0].note, "field 0 is empty") {
		t.Errorf("Warning events %s: %+v, want one about the empty field", reasonUnverified, w)
	}
	eventually(t, 5*time.Second, "recovery event", func() bool { return len(rec.find(reasonVerified)) == 1 })

	// The server serves a leaf of a CA the bundle does not hold.
	_, stale := issuedCA(t, "dropped")
	served.set(stale)
	eventually(t, 5*time.Second, "stale leaf detected", func() bool {
		return verifiedGauge(t, ValidatingWebhookConfiguration, name) == 0
	})
	err = p.HealthCheck().Check(nil)
	if err == nil || !strings.Contains(err.Error(), "ValidatingWebhookConfiguration/"+name+": published bundle does not verify what is served") ||
		!strings.Contains(err.Error(), stale.Cert.SerialNumber.Text(16)) {
		t.Errorf("health check %v, want it to name the object and the leaf", err)
	}
	if n := unverifiedEpisodes(t, ValidatingWebhookConfiguration, name); n != episodes+2 {
		t.Errorf("episodes %v, want %v", n, episodes+2)
	}
	served.set(leaf1)
	eventually(t, 5*time.Second, "verified again", func() bool {
		return verifiedGauge(t, ValidatingWebhookConfiguration, name) == 1 && p.HealthCheck().Check(nil) == nil
	})
}

// testServed is a CertKeyContentProvider serving a leaf the test changes;
// it notifies its listeners like evercert's providers.
type testServed struct {
	testCA // for the listeners
	leaf   *pki.Issued
}

var _ dynamiccertificates.CertKeyContentProvider = &testServed{}

func newTestServed(leaf *pki.Issued) *testServed { return &testServed{leaf: leaf} }

func (s *testServed) CurrentCertKeyContent() ([]byte, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leaf.CertPEM, s.leaf.KeyPEM
}

func (s *testServed) set(leaf *pki.Issued) {
	s.mu.Lock()
	s.leaf = leaf
	s.mu.Unlock()
	s.testCA.set(nil)
}
