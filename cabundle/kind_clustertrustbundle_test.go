package cabundle

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/evercert/evercert/internal/pki"
)

func TestClusterTrustBundleName(t *testing.T) {
	if got, want := ClusterTrustBundleName("evercert.io/serving", "ca"), "evercert.io:serving:ca"; got != want {
		t.Errorf("ClusterTrustBundleName = %q, want %q", got, want)
	}
}

// TestClusterTrustBundleTargetValidation: a ClusterTrustBundle target is
// named with its signer's prefix, and only it has a signer name.
func TestClusterTrustBundleTargetValidation(t *testing.T) {
	for _, tc := range []struct {
		target Target
		want   string // substring of the error, "" for none
	}{
		{Target{Kind: ClusterTrustBundle, Name: "evercert.io:serving:ca", SignerName: "evercert.io/serving"}, ""},
		{Target{Kind: ClusterTrustBundle, Name: "evercert.io:serving:ca"}, "SignerName is required"},
		{Target{Kind: ClusterTrustBundle, Name: "other:ca", SignerName: "evercert.io/serving"}, `must start with "evercert.io:serving:"`},
		{Target{Kind: ClusterTrustBundle, Name: "a/b", SignerName: "a/b"}, "is invalid"},
		{Target{Kind: ValidatingWebhookConfiguration, Name: "x", SignerName: "evercert.io/serving"}, "only a ClusterTrustBundle target has a signer name"},
		{Target{Kind: ClusterTrustBundle, Name: "evercert.io:serving:ca", SignerName: "evercert.io/serving", Service: &ServiceRef{Namespace: "a", Name: "b"}}, "refers to no Service"},
	} {
		err := tc.target.validate("T")
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: unexpected error %v", tc.target, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: error %v, want one containing %q", tc.target, err, tc.want)
		}
	}
}

// TestClusterTrustBundlePublisher runs a publisher with a named
// ClusterTrustBundle target: it creates the missing bundle with its signer
// name, replaces the bundle in place when the source rotates, repairs a
// bundle another writer changed (JSON patch mode), and observes (authority.Observer) a CA
// only once the bundle was read back holding it. Both write modes.
func TestClusterTrustBundlePublisher(t *testing.T) {
	for _, ssa := range []bool{false, true} {
		t.Run(map[bool]string{false: "jsonpatch", true: "apply"}[ssa], func(t *testing.T) {
			const signer = "evercert.io/serving"
			name := ClusterTrustBundleName(signer, "ca")
			first := newBundle(t, "first")
			source := newTestCA(first)
			f := fakeClients{kube: kubefake.NewClientset()}
			p, err := NewPublisher(f.config(source, ssa, Target{Kind: ClusterTrustBundle, Name: name, SignerName: signer}))
			if err != nil {
				t.Fatal(err)
			}
			runPublisher(t, p)
			waitReady(t, p, 10*time.Second)
			ctbs := f.kube.CertificatesV1().ClusterTrustBundles()
			get := func() *certificatesv1.ClusterTrustBundle {
				o, err := ctbs.Get(context.Background(), name, metav1.GetOptions{})
				if err != nil {
					t.Fatalf("get %s: %v", name, err)
				}
				return o
			}
			if o := get(); o.Spec.SignerName != signer || o.Spec.TrustBundle != string(first) {
				t.Fatalf("created bundle: signer %q, trustBundle %q; want %q and the source's bundle", o.Spec.SignerName, o.Spec.TrustBundle, signer)
			}
			firstCA := parseOne(t, first)
			eventually(t, 5*time.Second, "first CA observed", func() bool { return p.Observed(firstCA) })

			// Rotation: old and new CA together, replaced in place.
			second := newBundle(t, "second")
			both := append(append([]byte{}, first...), second...)
			secondCA := parseOne(t, second)
			if p.Observed(secondCA) {
				t.Fatal("successor observed before it was published")
			}
			source.set(both)
			eventually(t, 5*time.Second, "rotated bundle published", func() bool { return get().Spec.TrustBundle == string(both) })
			eventually(t, 5*time.Second, "successor observed", func() bool { return p.Observed(secondCA) })

			if ssa {
				// A change by another field manager is a server-side-apply
				// conflict, contested by design (contest_test.go).
				return
			}
			// Drift: a re-apply drops the old CA; it is repaired.
			o := get()
			o.Spec.TrustBundle = string(second)
			if _, err := ctbs.Update(context.Background(), o, metav1.UpdateOptions{FieldManager: "helm"}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 5*time.Second, "drift repaired", func() bool { return get().Spec.TrustBundle == string(both) })
		})
	}
}

func parseOne(t *testing.T, pemBytes []byte) *x509.Certificate {
	t.Helper()
	certs, err := pki.ParseCABundle(pemBytes)
	if err != nil || len(certs) != 1 {
		t.Fatalf("parse CA: %v (%d certs)", err, len(certs))
	}
	return certs[0]
}

// TestClusterTrustBundleJSONPatch: spec.trustBundle is written as the PEM
// string (not base64 like caBundle), preconditioned on the version read,
// since every replica of a signer writes the same bundle.
func TestClusterTrustBundleJSONPatch(t *testing.T) {
	a := adapterOf(t, ClusterTrustBundle)
	bundle := newBundle(t, "ca")
	v := ctbView(ctbFixture("evercert.io:serving:ca", "evercert.io/serving", nil))
	v.resourceVersion = "7"
	pt, data, err := (&Publisher{}).buildWrite(a, v, v.slots, bundle)
	if err != nil {
		t.Fatal(err)
	}
	var ops []map[string]any
	if err := json.Unmarshal(data, &ops); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"op": "replace", "path": "/metadata/resourceVersion", "value": "7"},
		{"op": "add", "path": "/spec/trustBundle", "value": string(bundle)},
	}
	if pt != types.JSONPatchType || !reflect.DeepEqual(ops, want) {
		t.Errorf("patch %s %s, want %v", pt, data, want)
	}
}
