package deploy

import (
	"context"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/test/deploy/chart"
)

// TestHelmChartLifecycle walks the signer chart through the paths operators
// take on a real kube-apiserver, with a CA in its Secret (written by
// another field manager, as the replicas do) that must survive each step:
//  1. the kustomize base applied first (kubectl apply --server-side -k);
//  2. helm install over it is refused (Helm owns none of the objects) with
//     Helm's ownership error, and creates nothing;
//  3. helm install --take-ownership (docs/operating.md) adopts them;
//  4. helm upgrade to 2 replicas, then to 1: the Deployment and the
//     PodDisruptionBudget follow (none for one replica, whose budget would
//     block every drain);
//  5. helm uninstall keeps the CA Secret (helm.sh/resource-policy keep) and
//     removes the rest;
//  6. helm install again adopts the kept Secret and keeps its CA.
func TestHelmChartLifecycle(t *testing.T) {
	c := testcluster.Start(t)
	cfg := c.Config()
	cs := kubernetes.NewForConfigOrDie(cfg)
	a := newApplier(t, cfg)
	kubeconfig := adminKubeconfig(t, c)
	var d chart.Deployable
	for _, x := range chart.Deployables {
		if x.Name == "signer" {
			d = x
		}
	}
	ns := d.Namespace
	ch := loadChart(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// 1. The base, server-side applied, and a CA written into its Secret.
	base := render(t, d.Name)
	createNamespaces(ctx, t, cs, base)
	for _, o := range base {
		if o.GetKind() == "Namespace" {
			continue
		}
		if _, err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("kubectl apply --server-side -k deploy/kustomize/%s: %s %s: %v", d.Name, o.GetKind(), o.GetName(), err)
		}
	}
	secretName := one[corev1.Secret](t, base, "Secret").Name
	sec, err := cs.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca := []byte("-----BEGIN CERTIFICATE-----\nthe replicas' CA\n-----END CERTIFICATE-----\n")
	sec.Data = map[string][]byte{"ca.crt": ca}
	if _, err := cs.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{FieldManager: "evercert"}); err != nil {
		t.Fatal(err)
	}
	caKept := func(step string) {
		t.Helper()
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: CA Secret %s/%s: %v", step, ns, secretName, err)
		}
		if string(s.Data["ca.crt"]) != string(ca) {
			t.Errorf("%s: CA Secret %s/%s lost its CA: data %q", step, ns, secretName, s.Data)
		}
	}

	// 2. helm install over the base.
	if _, err := lifecycleInstall(t, kubeconfig, d, false).RunWithContext(ctx, ch, nil); err == nil || !strings.Contains(err.Error(), "exists and cannot be imported into the current release") {
		t.Fatalf("helm install over deploy/kustomize/%s: %v, want Helm's ownership error", d.Name, err)
	} else {
		t.Logf("helm install over the base: %v", err)
	}
	caKept("helm install refused")

	// 3. helm install --take-ownership.
	rel, err := lifecycleInstall(t, kubeconfig, d, true).RunWithContext(ctx, ch, nil)
	if err != nil {
		t.Fatalf("helm install --take-ownership over deploy/kustomize/%s: %v", d.Name, err)
	}
	if rel.Info.Status != release.StatusDeployed {
		t.Fatalf("release %s: %s", rel.Name, rel.Info.Status)
	}
	caKept("helm install --take-ownership")

	// 4. helm upgrade --set replicaCount=2, then 1.
	for _, replicas := range []int{2, 1} {
		up := action.NewUpgrade(helmActionConfig(t, kubeconfig, ns))
		up.Namespace = ns
		if _, err := up.RunWithContext(ctx, d.Name, ch, map[string]any{"replicaCount": replicas}); err != nil {
			t.Fatalf("helm upgrade --set replicaCount=%d: %v", replicas, err)
		}
		dep, err := cs.AppsV1().Deployments(ns).Get(ctx, "evercert-signer", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if *dep.Spec.Replicas != int32(replicas) {
			t.Errorf("helm upgrade --set replicaCount=%d: Deployment replicas %d", replicas, *dep.Spec.Replicas)
		}
		pdb, err := cs.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "evercert-signer", metav1.GetOptions{})
		switch {
		case replicas == 1 && !apierrors.IsNotFound(err):
			t.Errorf("helm upgrade --set replicaCount=1: PodDisruptionBudget %v (err %v), want none", pdb.Spec.MinAvailable, err)
		case replicas > 1 && (err != nil || pdb.Spec.MinAvailable.IntValue() != replicas-1):
			t.Errorf("helm upgrade --set replicaCount=%d: PodDisruptionBudget %v (err %v), want minAvailable %d", replicas, pdb.Spec.MinAvailable, err, replicas-1)
		}
		caKept("helm upgrade")
	}

	// 5. helm uninstall.
	un := action.NewUninstall(helmActionConfig(t, kubeconfig, ns))
	res, err := un.Run(d.Name)
	if err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	t.Logf("helm uninstall: %s", res.Info)
	caKept("helm uninstall")
	if _, err := cs.AppsV1().Deployments(ns).Get(ctx, "evercert-signer", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall: Deployment evercert-signer: %v, want NotFound", err)
	}

	// 6. helm install again, without --take-ownership.
	if _, err := lifecycleInstall(t, kubeconfig, d, false).RunWithContext(ctx, ch, nil); err != nil {
		t.Fatalf("helm install after helm uninstall: %v", err)
	}
	caKept("helm install after helm uninstall")
}

// lifecycleInstall is newInstall, with --take-ownership when take is set.
func lifecycleInstall(t *testing.T, kubeconfig string, d chart.Deployable, take bool) *action.Install {
	t.Helper()
	i := newInstall(t, kubeconfig, d)
	i.TakeOwnership = take
	return i
}

// helmActionConfig is the action.Configuration newInstall makes, for the
// other actions.
func helmActionConfig(t *testing.T, kubeconfig, namespace string) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	cacheDir := t.TempDir()
	flags.KubeConfig, flags.Namespace, flags.CacheDir = &kubeconfig, &namespace, &cacheDir
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, namespace, "secret", func(format string, v ...any) { t.Logf("helm: "+format, v...) }); err != nil {
		t.Fatal(err)
	}
	return cfg
}
