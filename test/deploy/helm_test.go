package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"helm.sh/helm/v3/pkg/action"
	helmchart "helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/release"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/kustomize/api/hasher"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/test/deploy/chart"
)

// TestHelmChartLint runs Helm's linter (pkg/lint, what helm lint runs) on
// every chart of deploy/helm, with its default values and with the
// non-default values of TestHelmChartValues. Any warning or error fails;
// informational messages (no icon) are logged.
func TestHelmChartLint(t *testing.T) {
	for _, d := range chart.Deployables {
		t.Run(d.Name, func(t *testing.T) {
			for _, v := range []struct {
				name string
				vals map[string]any
			}{{"default values", nil}, {"non-default values", nonDefaultValues[d.Name].vals}} {
				l := lint.All(d.Dir(repoRoot(t)), v.vals, d.Namespace, false)
				for _, m := range l.Messages {
					if m.Severity >= support.WarningSev {
						t.Errorf("helm lint deploy/helm/%s (%s): %s", d.Name, v.name, m)
					} else {
						t.Logf("helm lint deploy/helm/%s (%s): %s", d.Name, v.name, m)
					}
				}
			}
		})
	}
}

// TestKustomizeBasesAreTheChartRendered: the kustomize bases are the charts
// rendered with their default values. The objects helm template renders
// (action.Install, DryRun and ClientOnly) into each base's namespace must be
// those of the base after kustomize build, but its Namespace, compared as
// objects (every field and value); and each generated file of the base must
// be what make generate-kustomize writes now (the data files of its
// ConfigMaps and kustomization.yaml below its generated header included),
// with no stale one left.
//
// The comparison normalises one thing only, which the base differs in on
// purpose (chartNamed): the base makes each ConfigMap of the chart with a
// configMapGenerator, so kustomize names it <name>-<hash>, the hash of its
// content, and an overlay that replaces its data rolls the pods
// (TestKustomizeOverlayPolicyRollsPods). The ConfigMap's name must be
// exactly <name>-<kustomize's hash of its name and data>; it is compared as
// <name>, and every string equal to <name>-<hash> in the base's objects (the
// pod template's volume, which kustomize's nameReference rewrote) as <name>.
// Nothing else: the pod templates' checksum annotations are the chart's
// for its default values in both.
func TestKustomizeBasesAreTheChartRendered(t *testing.T) {
	for _, d := range chart.Deployables {
		t.Run(d.Name, func(t *testing.T) {
			root := repoRoot(t)
			fromChart := templateObjects(t, loadChart(t, d), d.Namespace, nil)
			var fromBase []*unstructured.Unstructured
			for _, o := range chartNamed(t, d, render(t, d.Name)) {
				if o.GetKind() == "Namespace" {
					if o.GetName() != d.Namespace {
						t.Errorf("deploy/kustomize/%s: Namespace %s, want %s (the release namespace it is rendered with)", d.Name, o.GetName(), d.Namespace)
					}
					continue
				}
				fromBase = append(fromBase, o)
			}
			compareObjects(t, "helm template deploy/helm/"+d.Name, fromChart, "kustomize build deploy/kustomize/"+d.Name, fromBase)

			want, err := d.BaseFiles(root)
			if err != nil {
				t.Fatal(err)
			}
			for name, content := range want {
				got, err := os.ReadFile(filepath.Join(d.BaseDir(root), name))
				if err != nil {
					t.Errorf("deploy/kustomize/%s/%s: %v (run make generate-kustomize)", d.Name, name, err)
				} else if !bytes.Equal(got, content) {
					t.Errorf("deploy/kustomize/%s/%s is not what deploy/helm/%s renders (run make generate-kustomize)", d.Name, name, d.Name)
				}
			}
			stale, err := d.StaleFiles(root, want)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range stale {
				t.Errorf("deploy/kustomize/%s/%s was generated from a template deploy/helm/%s no longer has (run make generate-kustomize)", d.Name, name, d.Name)
			}
		})
	}
}

// chartNamed returns objs, the objects kustomize build renders from the
// base of d, with the names the chart gives them: each ConfigMap its
// configMapGenerators make, named <name>-<hash> by kustomize, renamed
// <name>, and every string equal to <name>-<hash> in objs (the references
// kustomize rewrote) replaced by <name>. It fails t unless each of those
// ConfigMaps is in objs named with exactly kustomize's hash of its content:
// the suffix is what rolls the pods when an overlay replaces the content.
func chartNamed(t *testing.T, d chart.Deployable, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	gens, err := d.GeneratedConfigMaps(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	renamed := map[string]string{}
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		// A copy through JSON: kustomize's maps hold ints, which
		// Unstructured.DeepCopy refuses.
		m := map[string]any{}
		if err := json.Unmarshal([]byte(jsonOf(o.Object)), &m); err != nil {
			t.Fatal(err)
		}
		out[i] = &unstructured.Unstructured{Object: m}
	}
	for _, g := range gens {
		var found []*unstructured.Unstructured
		for _, o := range out {
			if o.GetKind() == "ConfigMap" && o.GetNamespace() == g.Namespace && strings.HasPrefix(o.GetName(), g.Name+"-") {
				found = append(found, o)
			}
		}
		if len(found) != 1 {
			t.Errorf("deploy/kustomize/%s: %d ConfigMaps %s/%s-<hash>, want the one its configMapGenerator makes (without the hash suffix an overlay that replaces its data does not roll the pods)", d.Name, len(found), g.Namespace, g.Name)
			continue
		}
		o := found[0]
		suffixed := o.GetName()
		o.SetName(g.Name)
		node, err := kyaml.FromMap(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		hash, err := (&hasher.Hasher{}).Hash(node)
		if err != nil {
			t.Fatal(err)
		}
		if suffixed != g.Name+"-"+hash {
			t.Errorf("deploy/kustomize/%s: ConfigMap %s/%s, want %s-%s (kustomize's hash of its content)", d.Name, g.Namespace, suffixed, g.Name, hash)
		}
		renamed[suffixed] = g.Name
	}
	var replace func(v any) any
	replace = func(v any) any {
		switch x := v.(type) {
		case string:
			if n, ok := renamed[x]; ok {
				return n
			}
		case map[string]any:
			for k, e := range x {
				x[k] = replace(e)
			}
		case []any:
			for i, e := range x {
				x[i] = replace(e)
			}
		}
		return v
	}
	for _, o := range out {
		replace(o.Object)
	}
	return out
}

// chartValues are values other than the defaults for one chart, and what
// they must render.
type chartValues struct {
	vals map[string]any
	// flags are the arguments of the container that vals set.
	flags map[string]string
	// check fails t where the rendered objects do not carry vals
	// otherwise (object names, fields, RBAC).
	check func(t *testing.T, objs []*unstructured.Unstructured)
}

// valuesNamespace is the release namespace of the non-default renderings:
// every object and flag that names the namespace must follow it.
const valuesNamespace = "team-a"

// signerPolicy is the non-default policy of the signer chart.
const signerPolicy = "clusterDomain: corp.local\nrules:\n  - namespace: team-a\n    serviceAccounts: [\"api\"]\n    serviceNames: true\n"

var nonDefaultValues = map[string]chartValues{
	"webhook": {
		vals: map[string]any{
			"image":                map[string]any{"repository": "registry.example.com/evercert/webhook", "tag": "v9"},
			"replicaCount":         5,
			"replicaIDFromPodName": false,
			"caSecret":             "team-a-ca",
			"caPropagationDelay":   "90m",
			"keyTypes":             []any{"ecdsa-p384", "rsa-3072"},
			"caBundle":             map[string]any{"validatingWebhookConfiguration": "team-a-validating", "mutatingWebhookConfiguration": "team-a-mutating"},
		},
		flags: map[string]string{
			"--ca-secret":                        valuesNamespace + "/team-a-ca",
			"--ca-propagation-delay":             "90m",
			"--self-signed-key-types":            "ecdsa-p384,rsa-3072",
			"--validating-webhook-configuration": "team-a-validating",
			"--mutating-webhook-configuration":   "team-a-mutating",
			"--webhook-service":                  valuesNamespace + "/evercert-example-webhook",
			"--self-signed-hosts":                "evercert-example-webhook." + valuesNamespace + ".svc",
		},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			c := checkWorkload(t, objs, "registry.example.com/evercert/webhook:v9", 5)
			if len(c.Env) != 0 {
				t.Errorf("replicaIDFromPodName false: want no env (--replica-id from the host name), got %+v", c.Env)
			}
			for kind, name := range map[string]string{"ValidatingWebhookConfiguration": "team-a-validating", "MutatingWebhookConfiguration": "team-a-mutating", "Secret": "team-a-ca"} {
				if o := only(objs, kind); len(o) != 1 || o[0].GetName() != name {
					t.Errorf("want one %s named %s, got %d", kind, name, len(o))
				}
			}
			for _, o := range only(objs, "ValidatingWebhookConfiguration") {
				if ns, _, _ := unstructured.NestedString(o.Object["webhooks"].([]any)[0].(map[string]any), "clientConfig", "service", "namespace"); ns != valuesNamespace {
					t.Errorf("ValidatingWebhookConfiguration: clientConfig.service.namespace %q, want %q", ns, valuesNamespace)
				}
			}
			wantResourceNames(t, objs, "Role", "evercert-example-webhook-ca", "secrets", "team-a-ca")
			wantResourceNames(t, objs, "ClusterRole", "evercert-example-webhook-cabundle", "validatingwebhookconfigurations", "team-a-validating", "team-a-mutating")
		},
	},
	"signer": {
		vals: map[string]any{
			"image":                map[string]any{"repository": "registry.example.com/evercert/signer", "tag": "v9"},
			"replicaCount":         2,
			"replicaIDFromPodName": true,
			"caSecret":             "team-a-signer-ca",
			"caPropagationDelay":   "2h",
			"keyTypes":             []any{"ECDSAP384", "ED25519"},
			"caKeyTypes":           []any{"rsa-3072"},
			"signerName":           "example.com/internal",
			"clusterTrustBundle":   "roots",
			"policy":               signerPolicy,
		},
		flags: map[string]string{
			"--ca-secret":             valuesNamespace + "/team-a-signer-ca",
			"--ca-propagation-delay":  "2h",
			"--key-types":             "ECDSAP384,ED25519",
			"--self-signed-key-types": "rsa-3072",
			"--signer-name":           "example.com/internal",
			"--cluster-trust-bundle":  "roots",
			"--self-signed-hosts":     "evercert-signer." + valuesNamespace + ".svc",
		},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			c := checkWorkload(t, objs, "registry.example.com/evercert/signer:v9", 2)
			wantPodNameEnv(t, c)
			cm := one[corev1.ConfigMap](t, objs, "ConfigMap")
			if got := cm.Data["policy.yaml"]; got != signerPolicy {
				t.Errorf("ConfigMap %s: policy.yaml %q, want the value policy", cm.Name, got)
			}
			d := one[appsv1.Deployment](t, objs, "Deployment")
			if vol := volume(d, "policy"); vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != cm.Name {
				t.Errorf("the policy volume does not mount the ConfigMap %s: %+v", cm.Name, vol)
			}
			wantResourceNames(t, objs, "Role", "evercert-signer-ca", "secrets", "team-a-signer-ca")
			wantResourceNames(t, objs, "ClusterRole", "evercert-signer", "signers", "example.com/internal")
			wantResourceNames(t, objs, "ClusterRole", "evercert-signer-clustertrustbundle", "signers", "example.com/internal")
			wantResourceNames(t, objs, "ClusterRole", "evercert-signer-clustertrustbundle", "clustertrustbundles", "example.com:internal:roots")
		},
	},
	"apiserver": {
		vals: map[string]any{
			"image":                map[string]any{"repository": "registry.example.com/evercert/apiserver", "tag": "v9"},
			"replicaCount":         4,
			"signerName":           "example.com/internal",
			"keyType":              "ED25519",
			"maxExpirationSeconds": 7200,
		},
		flags: map[string]string{"--apiservice-service": valuesNamespace + "/evercert-example-apiserver"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			checkWorkload(t, objs, "registry.example.com/evercert/apiserver:v9", 4)
			d := one[appsv1.Deployment](t, objs, "Deployment")
			tls, trust := volume(d, "tls"), volume(d, "trust")
			if tls == nil || tls.Projected == nil || len(tls.Projected.Sources) != 1 || tls.Projected.Sources[0].PodCertificate == nil {
				t.Fatalf("want a podCertificate volume tls, got %+v", tls)
			}
			if pc := tls.Projected.Sources[0].PodCertificate; pc.SignerName != "example.com/internal" || pc.KeyType != "ED25519" || pc.MaxExpirationSeconds == nil || *pc.MaxExpirationSeconds != 7200 {
				t.Errorf("podCertificate: signerName %q keyType %q maxExpirationSeconds %v, want example.com/internal ED25519 7200", pc.SignerName, pc.KeyType, pc.MaxExpirationSeconds)
			}
			if trust == nil || trust.Projected == nil || len(trust.Projected.Sources) != 1 || trust.Projected.Sources[0].ClusterTrustBundle == nil ||
				trust.Projected.Sources[0].ClusterTrustBundle.SignerName == nil || *trust.Projected.Sources[0].ClusterTrustBundle.SignerName != "example.com/internal" {
				t.Errorf("want the clusterTrustBundle volume trust of signer example.com/internal, got %+v", trust)
			}
			if o := only(objs, "APIService"); len(o) != 1 {
				t.Errorf("want one APIService, got %d", len(o))
			} else if ns, _, _ := unstructured.NestedString(o[0].Object, "spec", "service", "namespace"); ns != valuesNamespace {
				t.Errorf("APIService: spec.service.namespace %q, want %q", ns, valuesNamespace)
			}
		},
	},
}

// TestHelmChartValues renders every chart (helm template) with values other
// than its defaults, into another namespace, and checks the flags and
// fields each value sets; then runs the example's binary (its image's
// entrypoint) with the rendered arguments and --help, as
// TestManifestFlagsExist does for the bases: a flag a value sets that the
// binary does not have, or a value it cannot parse, fails. The default
// rendering must differ from this one in every checked place, so each
// value is known to reach its flag or field.
func TestHelmChartValues(t *testing.T) {
	for _, d := range chart.Deployables {
		t.Run(d.Name, func(t *testing.T) {
			v := nonDefaultValues[d.Name]
			ch := loadChart(t, d)
			objs := templateObjects(t, ch, valuesNamespace, v.vals)
			for _, o := range objs {
				if ns := o.GetNamespace(); ns != "" && ns != valuesNamespace && ns != "kube-system" && ns != "default" {
					t.Errorf("%s %s: namespace %q, want the release namespace %q", o.GetKind(), o.GetName(), ns, valuesNamespace)
				}
			}
			v.check(t, objs)
			args := one[appsv1.Deployment](t, objs, "Deployment").Spec.Template.Spec.Containers[0].Args
			wantFlags(t, args, v.flags)
			// Each of those flags has another value (or none) by default: a
			// value that reached no flag would pass the check above only if
			// the default already said the same.
			defaultArgs := one[appsv1.Deployment](t, templateObjects(t, ch, d.Namespace, nil), "Deployment").Spec.Template.Spec.Containers[0].Args
			for name, want := range v.flags {
				if flagValue(defaultArgs, name) == want {
					t.Errorf("%s=%s is also the default: the check does not show the value reaches the flag", name, want)
				}
			}

			u := exampleImage(t, d.Name)
			code, out := proctest.RunToExit(t, exec.Command(u.bin(), append(slices.Clone(args), "--help")...))
			if code != 0 {
				t.Errorf("%s %s --help: exit %d, want 0 (a flag a value sets does not exist or does not parse):\n%s", d.Name, strings.Join(args, " "), code, out)
			}
		})
	}
}

// TestHelmChartInstall packages every chart (action.Package, helm package),
// pushes it to an OCI registry running in the test process with Helm's
// registry client (helm push oci://...), pulls it back, and then, on a real
// kube-apiserver, from the pulled chart: a server-side dry run (helm install
// --dry-run=server, then every rendered object server-side applied with
// dryRun=All, which runs the server's schema, validation, defaulting and
// admission) and a real install (action.Install, --create-namespace). Every
// object of the kustomize base must then be on the API server as the base
// has it (fields the server adds aside). No pod runs (there is no kubelet):
// the objects are what is checked, as in TestKustomizeBasesServerSideApply.
func TestHelmChartInstall(t *testing.T) {
	c := testcluster.Start(t)
	cfg := c.Config()
	cs := kubernetes.NewForConfigOrDie(cfg)
	a := newApplier(t, cfg)
	kubeconfig := adminKubeconfig(t, c)
	reg := httptest.NewServer(registry.New(registry.Logger(discardLogger())))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	rc, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
		helmregistry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "registry.json")))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range chart.Deployables {
		t.Run(d.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			fromDisk := loadChart(t, d)
			ref := fmt.Sprintf("%s/evercert/charts/%s:%s", host, d.Name, fromDisk.Metadata.Version)
			pulled := pushAndPull(t, rc, d, ref)
			if pulled.Metadata.Name != d.Name || pulled.Metadata.Version != fromDisk.Metadata.Version {
				t.Fatalf("pulled oci://%s: chart %s %s, want %s %s", ref, pulled.Metadata.Name, pulled.Metadata.Version, d.Name, fromDisk.Metadata.Version)
			}
			compareObjects(t, "the chart pulled from oci://"+ref, templateObjects(t, pulled, d.Namespace, nil), "deploy/helm/"+d.Name, templateObjects(t, fromDisk, d.Namespace, nil))

			// The chart's names: helm install makes the base's generated
			// ConfigMaps without kustomize's hash suffix.
			base := chartNamed(t, d, render(t, d.Name))
			createNamespaces(ctx, t, cs, base)

			// Server-side dry run: helm's (it renders against the
			// server's capabilities and creates nothing), then each object
			// through the server's admission with dryRun=All.
			dry := newInstall(t, kubeconfig, d)
			dry.DryRun, dry.DryRunOption = true, "server"
			rel, err := dry.RunWithContext(ctx, pulled, nil)
			if err != nil {
				t.Fatalf("helm install --dry-run=server oci://%s: %v", ref, err)
			}
			objs, err := chart.Objects(rel.Manifest)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				if _, err := a.apply(ctx, o, true); err != nil {
					t.Errorf("server-side apply (dry run) %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
			if dep := only(objs, "Deployment"); len(dep) == 1 {
				if _, err := cs.AppsV1().Deployments(d.Namespace).Get(ctx, dep[0].GetName(), metav1.GetOptions{}); err == nil {
					t.Errorf("Deployment %s exists after a dry run", dep[0].GetName())
				}
			}

			in := newInstall(t, kubeconfig, d)
			in.CreateNamespace = true
			rel, err = in.RunWithContext(ctx, pulled, nil)
			if err != nil {
				t.Fatalf("helm install oci://%s: %v", ref, err)
			}
			if rel.Info.Status != release.StatusDeployed {
				t.Errorf("release %s: status %s, want %s", rel.Name, rel.Info.Status, release.StatusDeployed)
			}
			for _, want := range base {
				if want.GetKind() == "Namespace" {
					continue
				}
				got, err := a.get(ctx, want)
				if err != nil {
					t.Errorf("after helm install: %s %s/%s: %v", want.GetKind(), want.GetNamespace(), want.GetName(), err)
					continue
				}
				if !subset(want.Object, got.Object) {
					t.Errorf("after helm install: %s %s/%s on the server is not the kustomize base's:\nbase   %s\nserver %s", want.GetKind(), want.GetNamespace(), want.GetName(), jsonOf(want.Object), jsonOf(got.Object))
				} else {
					t.Logf("installed %s %s/%s as the base has it", want.GetKind(), want.GetNamespace(), want.GetName())
				}
			}
		})
	}
}

// pushAndPull packages the chart of d as helm package does, pushes the
// archive to ref with Helm's registry client and pulls it back.
func pushAndPull(t *testing.T, rc *helmregistry.Client, d chart.Deployable, ref string) *helmchart.Chart {
	t.Helper()
	p := action.NewPackage()
	p.Destination = t.TempDir()
	archive, err := p.Run(d.Dir(repoRoot(t)), nil)
	if err != nil {
		t.Fatalf("helm package deploy/helm/%s: %v", d.Name, err)
	}
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Push(data, ref); err != nil {
		t.Fatalf("helm push %s oci://%s: %v", filepath.Base(archive), ref, err)
	}
	res, err := rc.Pull(ref, helmregistry.PullOptWithChart(true))
	if err != nil {
		t.Fatalf("helm pull oci://%s: %v", ref, err)
	}
	if !bytes.Equal(res.Chart.Data, data) {
		t.Errorf("oci://%s: the pulled archive (%s) is not the pushed one", ref, res.Chart.Digest)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(res.Chart.Data))
	if err != nil {
		t.Fatalf("load the chart pulled from oci://%s: %v", ref, err)
	}
	return ch
}

// newInstall returns helm install for the cluster of kubeconfig, releasing
// d into its namespace under the chart's name.
func newInstall(t *testing.T, kubeconfig string, d chart.Deployable) *action.Install {
	t.Helper()
	namespace := d.Namespace
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &kubeconfig, &namespace
	// Discovery caches in the test's directory, not in ~/.kube/cache.
	cacheDir := t.TempDir()
	flags.CacheDir = &cacheDir
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, namespace, "secret", func(format string, v ...any) { t.Logf("helm: "+format, v...) }); err != nil {
		t.Fatal(err)
	}
	i := action.NewInstall(cfg)
	i.Namespace = namespace
	i.ReleaseName = d.Name
	i.Timeout = time.Minute
	return i
}

// adminKubeconfig writes a kubeconfig of c's admin user, for Helm's
// RESTClientGetter.
func adminKubeconfig(t *testing.T, c *testcluster.Cluster) string {
	t.Helper()
	admin := c.Config()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: admin.Host, CertificateAuthorityData: admin.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: admin.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// discardLogger drops the in-process registry's request log.
func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// get reads obj's counterpart from the API server.
func (a *applier) get(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.dyn.Resource(m.Resource).Namespace(obj.GetNamespace()).Get(ctx, obj.GetName(), metav1.GetOptions{})
	}
	return a.dyn.Resource(m.Resource).Get(ctx, obj.GetName(), metav1.GetOptions{})
}

func loadChart(t *testing.T, d chart.Deployable) *helmchart.Chart {
	t.Helper()
	ch, err := d.Load(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// templateObjects renders ch as helm template does, into namespace, with
// vals over its defaults.
func templateObjects(t *testing.T, ch *helmchart.Chart, namespace string, vals map[string]any) []*unstructured.Unstructured {
	t.Helper()
	rel, err := chart.Template(ch, namespace, vals)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := chart.Objects(rel.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// compareObjects fails t unless a and b hold the same objects (by kind,
// namespace and name), each with the same fields and values.
func compareObjects(t *testing.T, aName string, a []*unstructured.Unstructured, bName string, b []*unstructured.Unstructured) {
	t.Helper()
	am, bm := byID(t, a), byID(t, b)
	for _, id := range sortedKeys(am) {
		bo, ok := bm[id]
		if !ok {
			t.Errorf("%s has %s, %s has not", aName, id, bName)
			continue
		}
		if !reflect.DeepEqual(am[id], bo) {
			t.Errorf("%s differs:\n%s: %s\n%s: %s", id, aName, jsonOf(am[id]), bName, jsonOf(bo))
		}
	}
	for _, id := range sortedKeys(bm) {
		if _, ok := am[id]; !ok {
			t.Errorf("%s has %s, %s has not", bName, id, aName)
		}
	}
}

// byID maps objects by kind, namespace and name to their content as JSON
// decodes it (so that numbers and empty values compare alike whoever
// parsed them).
func byID(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, o := range objs {
		id := fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
		if _, dup := out[id]; dup {
			t.Errorf("%s twice", id)
		}
		var v any
		if err := json.Unmarshal([]byte(jsonOf(o.Object)), &v); err != nil {
			t.Fatal(err)
		}
		out[id] = v
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func jsonOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v (%v)", v, err)
	}
	return string(b)
}

// checkWorkload checks the Deployment's image and replicas, that a rolling
// update of that many replicas needs no more nodes (TestBasesFollowTheRules),
// and the PodDisruptionBudget (all replicas but one), and returns its
// container.
func checkWorkload(t *testing.T, objs []*unstructured.Unstructured, image string, replicas int32) corev1.Container {
	t.Helper()
	d := one[appsv1.Deployment](t, objs, "Deployment")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != replicas {
		t.Errorf("Deployment %s: replicas %v, want %d", d.Name, d.Spec.Replicas, replicas)
	}
	if err := rollsOnAsManyNodes(d); err != nil {
		t.Errorf("Deployment %s: %v", d.Name, err)
	}
	pdb := one[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget")
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != int(replicas-1) {
		t.Errorf("PodDisruptionBudget %s: minAvailable %v, want %d", pdb.Name, pdb.Spec.MinAvailable, replicas-1)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != image {
		t.Errorf("container %s: image %q, want %q", c.Name, c.Image, image)
	}
	return c
}

// wantFlags fails t unless args set each flag to its value.
func wantFlags(t *testing.T, args []string, flags map[string]string) {
	t.Helper()
	for name, want := range flags {
		if got := flagValue(args, name); got != want {
			t.Errorf("%s=%q, want %q (args %q)", name, got, want, args)
		}
	}
}

// wantPodNameEnv fails t unless POD_NAME, the default of --replica-id, is
// the pod's name from the downward API.
func wantPodNameEnv(t *testing.T, c corev1.Container) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			return
		}
	}
	t.Errorf("container %s: want POD_NAME from metadata.name (the default of --replica-id), got %+v", c.Name, c.Env)
}

// wantResourceNames fails t unless the Role or ClusterRole kind/name has a
// rule on resource limited to exactly names.
func wantResourceNames(t *testing.T, objs []*unstructured.Unstructured, kind, name, resource string, names ...string) {
	t.Helper()
	for _, o := range only(objs, kind) {
		if o.GetName() != name {
			continue
		}
		var r rbacv1.ClusterRole // a Role's rules decode alike
		if err := json.Unmarshal([]byte(jsonOf(o.Object)), &r); err != nil {
			t.Fatal(err)
		}
		for _, rule := range r.Rules {
			if slices.Contains(rule.Resources, resource) && len(rule.ResourceNames) > 0 {
				if !slices.Equal(rule.ResourceNames, names) {
					t.Errorf("%s %s: %s resourceNames %q, want %q", kind, name, resource, rule.ResourceNames, names)
				}
				return
			}
		}
		t.Errorf("%s %s: no rule on %s limited by resourceNames", kind, name, resource)
		return
	}
	t.Errorf("no %s %s", kind, name)
}

// volume returns the pod volume of d named name, or nil.
func volume(d *appsv1.Deployment, name string) *corev1.Volume {
	for i, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == name {
			return &d.Spec.Template.Spec.Volumes[i]
		}
	}
	return nil
}
