package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestKustomizeOverlayPolicyRollsPods: an operator on the kustomize bases
// changes the signer's policy in an overlay, with a configMapGenerator that
// replaces the base's policy ConfigMap. The signer reads its policy once, at
// start, so the overlay must change the Deployment's pod template (the
// ConfigMap's name or a checksum): otherwise kubectl apply -k updates the
// ConfigMap and the running pods keep signing under the old policy until
// something else restarts them. The bases before the charts passed (a
// configMapGenerator in the base: kustomize's hash suffix changed the name
// the pods mount); the chart's checksum annotation is computed by Helm only,
// so in the generated base it is a constant, and the generator makes the
// chart's ConfigMaps with configMapGenerators again. The apiserver's
// kubeconfig, read at start too, is the same case.
func TestKustomizeOverlayPolicyRollsPods(t *testing.T) {
	for _, c := range []struct {
		base, configMap, namespace, file, content, what string
	}{
		{
			base: "signer", configMap: "evercert-signer-policy", namespace: "evercert-signer", file: "policy.yaml",
			content: "clusterDomain: corp.local\nrules:\n  - namespace: team-a\n    serviceAccounts: [\"api\"]\n    serviceNames: true\n",
			what:    "the policy",
		},
		{
			base: "apiserver", configMap: "evercert-example-apiserver-kubeconfig", namespace: "evercert-example-apiserver", file: "kubeconfig",
			content: "apiVersion: v1\nkind: Config\nclusters:\n  - name: corp\n    cluster:\n      server: https://kubernetes.corp.local\n",
			what:    "the kubeconfig",
		},
	} {
		t.Run(c.base, func(t *testing.T) {
			base := filepath.Join(repoRoot(t), "deploy", "kustomize", c.base)
			overlay := t.TempDir()
			rel, err := filepath.Rel(overlay, base)
			if err != nil {
				t.Fatal(err)
			}
			for name, content := range map[string]string{
				"kustomization.yaml": "resources:\n  - " + rel + "\n" +
					"configMapGenerator:\n  - name: " + c.configMap + "\n    namespace: " + c.namespace + "\n    behavior: replace\n    files:\n      - " + c.file + "\n",
				c.file: c.content,
			} {
				if err := os.WriteFile(filepath.Join(overlay, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			template := func(dir string) string {
				t.Helper()
				rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
				if err != nil {
					t.Fatalf("kustomize build %s: %v", dir, err)
				}
				var objs []*unstructured.Unstructured
				for _, r := range rm.Resources() {
					m, err := r.Map()
					if err != nil {
						t.Fatal(err)
					}
					objs = append(objs, &unstructured.Unstructured{Object: m})
				}
				return jsonOf(one[appsv1.Deployment](t, objs, "Deployment").Spec.Template)
			}
			if before, after := template(base), template(overlay); before == after {
				t.Errorf("an overlay that replaces %s of deploy/kustomize/%s leaves the Deployment's pod template as it was: the pods keep the old %s.\npod template: %s", c.what, c.base, strings.TrimPrefix(c.what, "the "), after)
			}
		})
	}
}
