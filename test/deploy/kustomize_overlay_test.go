package deploy

import (
	"os"
	"path/filepath"
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
// so in the generated base it is a constant.
func TestKustomizeOverlayPolicyRollsPods(t *testing.T) {
	base := filepath.Join(repoRoot(t), "deploy", "kustomize", "signer")
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, base)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"kustomization.yaml": "resources:\n  - " + rel + "\n" +
			"configMapGenerator:\n  - name: evercert-signer-policy\n    namespace: evercert-signer\n    behavior: replace\n    files:\n      - policy.yaml\n",
		"policy.yaml": "clusterDomain: corp.local\nrules:\n  - namespace: team-a\n    serviceAccounts: [\"api\"]\n    serviceNames: true\n",
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
		t.Errorf("an overlay that replaces the policy of deploy/kustomize/signer leaves the Deployment's pod template as it was: the pods keep the old policy.\npod template: %s", after)
	}
}
