package cabundle

import (
	"context"
	"fmt"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certificatesinformers "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/kubernetes"
)

// ClusterTrustBundle is a certificates.k8s.io/v1 ClusterTrustBundle; the
// field is spec.trustBundle. Unlike the other kinds, a named
// ClusterTrustBundle target owns its object: when it is missing the
// publisher creates it, with spec.signerName set to Target.SignerName
// (required for a named target of this kind, and immutable once created).
// Its name must then be ClusterTrustBundleName(SignerName, suffix), as the
// API server requires. Its client is PublisherConfig.KubeClient.
//
// Writing one needs RBAC on clustertrustbundles (get, list, watch, create,
// patch) and, for a bundle with a signer name, the attest verb on the
// signers resource named after the signer (certificates.k8s.io): the API
// server checks attest on every create and update.
const ClusterTrustBundle Kind = "ClusterTrustBundle"

func init() {
	registerKind(ClusterTrustBundle, withClient((*clients).kube, clusterTrustBundleAdapter))
}

var ctbAPIVersion = certificatesv1.SchemeGroupVersion.String()

// ctbPath is the JSON pointer of the one field of a ClusterTrustBundle.
const ctbPath = "/spec/trustBundle"

// ClusterTrustBundleName returns the name of the ClusterTrustBundle of
// signerName with the given suffix: the signer name with every "/" turned
// into ":", then ":" and suffix, e.g. "evercert.io:serving:ca" for
// ("evercert.io/serving", "ca"). The API server requires that prefix of
// every bundle with a signer name.
func ClusterTrustBundleName(signerName, suffix string) string {
	return clusterTrustBundlePrefix(signerName) + suffix
}

// clusterTrustBundlePrefix is the prefix every name of a ClusterTrustBundle
// of signerName must have.
func clusterTrustBundlePrefix(signerName string) string {
	return strings.ReplaceAll(signerName, "/", ":") + ":"
}

func clusterTrustBundleAdapter(client kubernetes.Interface) *kindAdapter {
	bundles := client.CertificatesV1().ClusterTrustBundles()
	return &kindAdapter{
		kind:        ClusterTrustBundle,
		apiVersion:  ctbAPIVersion,
		newInformer: informerOf(certificatesinformers.NewFilteredClusterTrustBundleInformer, client),
		view:        viewOf(ctbView),
		patch:       patchVia(bundles),
		applyBody: func(name string, _ []slot, bundle []byte) map[string]any {
			body := applyHeader(ctbAPIVersion, ClusterTrustBundle, name)
			// spec.trustBundle is a string, not base64 like caBundle.
			body["spec"] = map[string]any{"trustBundle": string(bundle)}
			return body
		},
		transform:      trimmed[certificatesv1.ClusterTrustBundle],
		stringField:    true,
		preconditioned: true,
		create: func(ctx context.Context, t Target, bundle []byte, fieldManager string) error {
			_, err := bundles.Create(ctx, &certificatesv1.ClusterTrustBundle{
				ObjectMeta: metav1.ObjectMeta{Name: t.Name},
				Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: t.SignerName, TrustBundle: string(bundle)},
			}, metav1.CreateOptions{FieldManager: fieldManager})
			return err
		},
	}
}

// ctbView has the one slot spec.trustBundle. ClusterTrustBundles refer to
// no Service.
func ctbView(o *certificatesv1.ClusterTrustBundle) objectView {
	v := newView(o)
	v.slots = []slot{{path: ctbPath, current: []byte(o.Spec.TrustBundle)}}
	return v
}

// validateClusterTrustBundle checks the fields of a ClusterTrustBundle
// target; field is the target's place in the configuration.
func (t Target) validateClusterTrustBundle(field string) error {
	if t.Service != nil {
		return fmt.Errorf("%s.Service is set, but a ClusterTrustBundle refers to no Service", field)
	}
	if t.Name == "" && t.SignerName != "" {
		return fmt.Errorf("%s.SignerName is set for a selector target, which never creates a bundle; select the bundles by label only", field)
	}
	if t.Name != "" && t.SignerName == "" {
		return fmt.Errorf("%s.SignerName is required for a named ClusterTrustBundle target: the publisher creates the bundle when it is missing", field)
	}
	if t.SignerName != "" && t.Name != "" && !strings.HasPrefix(t.Name, clusterTrustBundlePrefix(t.SignerName)) {
		return fmt.Errorf("%s.Name %q must start with %q, the prefix the API server requires for signer %q (see ClusterTrustBundleName)",
			field, t.Name, clusterTrustBundlePrefix(t.SignerName), t.SignerName)
	}
	return nil
}
