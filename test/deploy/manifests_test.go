package deploy

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/testcluster"
)

// TestBasesFollowTheRules checks what issue 20 asks of every base: a
// Deployment of 3 replicas spread by a required pod anti-affinity on the
// hostname, a PodDisruptionBudget that keeps 2 of them, liveness on /livez
// and readiness on /readyz at the container's HTTPS port, resource
// requests, a non-root read-only container without capabilities, a Service
// and a ServiceAccount the pods run as, and the webhook or API service
// object.
func TestBasesFollowTheRules(t *testing.T) {
	for _, b := range bases {
		t.Run(b.dir, func(t *testing.T) {
			objs := render(t, b.dir)
			d := one[appsv1.Deployment](t, objs, "Deployment")
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
				t.Errorf("Deployment %s: replicas %v, want 3", d.Name, d.Spec.Replicas)
			}
			pod := d.Spec.Template
			aa := pod.Spec.Affinity
			if aa == nil || aa.PodAntiAffinity == nil || len(aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
				aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != corev1.LabelHostname {
				t.Errorf("Deployment %s: want one required pod anti-affinity term on %s, got %+v", d.Name, corev1.LabelHostname, aa)
			} else if sel := aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector; sel == nil || !matches(sel.MatchLabels, pod.Labels) {
				t.Errorf("Deployment %s: the anti-affinity selector %v does not select its own pods %v", d.Name, sel, pod.Labels)
			}
			// A rolling update must not need a node without one of these
			// pods: the required anti-affinity leaves none on a cluster of 3
			// nodes, where the API server's default strategy (maxSurge 25%
			// = 1 pod, maxUnavailable 25% = 0 of 3) waits forever for its
			// surge pod to schedule.
			if err := rollsOnAsManyNodes(d); err != nil {
				t.Errorf("Deployment %s: %v", d.Name, err)
			}
			pdb := one[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget")
			if pdb.Spec.Selector == nil || !matches(pdb.Spec.Selector.MatchLabels, pod.Labels) {
				t.Errorf("PodDisruptionBudget %s: selector %v does not select the pods %v", pdb.Name, pdb.Spec.Selector, pod.Labels)
			}
			if pdb.Spec.MinAvailable == nil || *pdb.Spec.MinAvailable != intstr.FromInt32(2) {
				t.Errorf("PodDisruptionBudget %s: minAvailable %v, want 2", pdb.Name, pdb.Spec.MinAvailable)
			}
			if pod.Spec.ServiceAccountName != b.serviceAccount {
				t.Errorf("pods run as ServiceAccount %q, want %q", pod.Spec.ServiceAccountName, b.serviceAccount)
			}
			if sa := one[corev1.ServiceAccount](t, objs, "ServiceAccount"); sa.Name != b.serviceAccount || sa.Namespace != b.namespace {
				t.Errorf("ServiceAccount %s/%s, want %s/%s", sa.Namespace, sa.Name, b.namespace, b.serviceAccount)
			}
			psc := pod.Spec.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
				t.Errorf("Deployment %s: pod securityContext.runAsNonRoot must be true", d.Name)
			}
			if len(pod.Spec.Containers) != 1 {
				t.Fatalf("Deployment %s: want one container, got %d", d.Name, len(pod.Spec.Containers))
			}
			c := pod.Spec.Containers[0]
			sc := c.SecurityContext
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("container %s: want readOnlyRootFilesystem, no privilege escalation, drop ALL; got %+v", c.Name, sc)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("container %s: want cpu and memory requests, got %v", c.Name, c.Resources.Requests)
			}
			if len(c.Ports) != 1 || c.Ports[0].Name != "https" {
				t.Fatalf("container %s: want one port named https, got %+v", c.Name, c.Ports)
			}
			port := c.Ports[0].ContainerPort
			if got := flagValue(c.Args, "--secure-port"); got != itoa(port) {
				t.Errorf("container %s: --secure-port %q, but the container port is %d", c.Name, got, port)
			}
			if got := flagValue(c.Args, "--bind-address"); got != "0.0.0.0" {
				t.Errorf("container %s: --bind-address %q, want 0.0.0.0 (the default 127.0.0.1 is unreachable from the kubelet and the Service)", c.Name, got)
			}
			for _, p := range []struct {
				name  string
				probe *corev1.Probe
				path  string
			}{{"liveness", c.LivenessProbe, "/livez"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
				if p.probe == nil || p.probe.HTTPGet == nil {
					t.Errorf("container %s: no HTTP %s probe", c.Name, p.name)
					continue
				}
				g := p.probe.HTTPGet
				if g.Path != p.path || g.Scheme != corev1.URISchemeHTTPS || g.Port != intstr.FromString("https") {
					t.Errorf("container %s: %s probe %s %s port %v, want HTTPS %s on port https", c.Name, p.name, g.Scheme, g.Path, g.Port.String(), p.path)
				}
			}
			svc := one[corev1.Service](t, objs, "Service")
			if !matches(svc.Spec.Selector, pod.Labels) || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != intstr.FromString("https") {
				t.Errorf("Service %s: want it to select the pods and target port https, got %+v", svc.Name, svc.Spec)
			}
			switch b.dir {
			case "webhook":
				for _, kind := range []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"} {
					o := only(objs, kind)
					if len(o) != 1 || o[0].GetName() != flagValue(c.Args, "--"+kebab(kind)) {
						t.Errorf("want one %s named as the flag --%s %q", kind, kebab(kind), flagValue(c.Args, "--"+kebab(kind)))
					}
				}
				if got, want := flagValue(c.Args, "--webhook-service"), svc.Namespace+"/"+svc.Name; got != want {
					t.Errorf("--webhook-service %q, want the Service %s", got, want)
				}
			case "apiserver":
				if o := only(objs, "APIService"); len(o) != 1 || o[0].GetName() != "v1alpha1.certificates.evercert.io" {
					t.Errorf("want the APIService v1alpha1.certificates.evercert.io")
				}
				if got, want := flagValue(c.Args, "--apiservice-service"), svc.Namespace+"/"+svc.Name; got != want {
					t.Errorf("--apiservice-service %q, want the Service %s", got, want)
				}
			}
		})
	}
}

// rollsOnAsManyNodes reports why a rolling update of d would need more
// nodes than replicas: it takes no pod down before its surge pod is ready.
// An unset strategy is the API server's default, RollingUpdate with 25% and
// 25%.
func rollsOnAsManyNodes(d *appsv1.Deployment) error {
	if d.Spec.Strategy.Type != "" && d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
		return fmt.Errorf("strategy %s, want %s (each replica serves; Recreate takes them all down)", d.Spec.Strategy.Type, appsv1.RollingUpdateDeploymentStrategyType)
	}
	surge, unavailable := intstr.FromString("25%"), intstr.FromString("25%")
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil {
		if ru.MaxSurge != nil {
			surge = *ru.MaxSurge
		}
		if ru.MaxUnavailable != nil {
			unavailable = *ru.MaxUnavailable
		}
	}
	replicas := 1
	if d.Spec.Replicas != nil {
		replicas = int(*d.Spec.Replicas)
	}
	// The deployment controller rounds maxSurge up and maxUnavailable down.
	s, err := intstr.GetScaledValueFromIntOrPercent(&surge, replicas, true)
	if err != nil {
		return err
	}
	u, err := intstr.GetScaledValueFromIntOrPercent(&unavailable, replicas, false)
	if err != nil {
		return err
	}
	if u < 1 {
		return fmt.Errorf("a rolling update (maxSurge %d, maxUnavailable %d of %d) starts a surge pod before it stops one, and the required pod anti-affinity on %s gives it no node on a cluster of %d nodes: the rollout never progresses; set maxUnavailable to 1",
			s, u, replicas, corev1.LabelHostname, replicas)
	}
	return nil
}

// TestManifestFlagsExist runs each image's entrypoint with the arguments of
// its Deployment followed by --help: the programs parse their flags in
// order, so a flag the program does not have, or a value it cannot parse,
// fails before --help is reached. The same with one made-up flag must fail,
// so the check is known to bite.
func TestManifestFlagsExist(t *testing.T) {
	for _, b := range bases {
		t.Run(b.dir, func(t *testing.T) {
			d := one[appsv1.Deployment](t, render(t, b.dir), "Deployment")
			args := d.Spec.Template.Spec.Containers[0].Args
			if len(args) == 0 {
				t.Fatal("the Deployment passes no arguments")
			}
			u := exampleImage(t, b.dir)
			code, out := proctest.RunToExit(t, exec.Command(u.bin(), append(slices.Clone(args), "--help")...))
			if code != 0 {
				t.Errorf("%s %s --help: exit %d, want 0 (a flag of the Deployment does not exist or does not parse):\n%s", b.dir, strings.Join(args, " "), code, out)
			}
			for _, a := range args {
				name, _, _ := strings.Cut(a, "=")
				if !strings.Contains(out, name+" ") && !strings.Contains(out, name+"=") {
					t.Errorf("%s --help does not document %s", b.dir, name)
				}
			}
			code, out = proctest.RunToExit(t, exec.Command(u.bin(), append(slices.Clone(args), "--no-such-flag=1", "--help")...))
			if code == 0 {
				t.Errorf("%s with --no-such-flag: exit 0, want an error (the check above would not catch a wrong flag):\n%s", b.dir, out)
			}
		})
	}
}

// TestKustomizeBasesServerSideApply renders every base with the kustomize Go
// API and applies every object with server-side apply and dryRun=All to a
// real kube-apiserver (its Namespace is created for real first: a dry run
// creates nothing). Every object must be accepted: schema, validation,
// defaulting and admission of the real server.
func TestKustomizeBasesServerSideApply(t *testing.T) {
	c := testcluster.Start(t)
	cfg := c.Config()
	cs := kubernetes.NewForConfigOrDie(cfg)
	a := newApplier(t, cfg)
	for _, b := range bases {
		t.Run(b.dir, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			objs := render(t, b.dir)
			createNamespaces(ctx, t, cs, objs)
			for _, o := range objs {
				got, err := a.apply(ctx, o, true)
				if err != nil {
					t.Errorf("server-side apply (dry run) %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
					continue
				}
				t.Logf("accepted %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
				// The dry run answers with the object as it would be
				// stored: nothing this test relies on may be dropped (a
				// field of a disabled feature would be, silently).
				if o.GetKind() == "Deployment" {
					checkKept(t, o, got, "spec", "template", "spec", "volumes")
					checkKept(t, o, got, "spec", "template", "spec", "affinity")
				}
			}
			// Nothing was created but the namespace.
			if d := only(objs, "Deployment"); len(d) == 1 {
				if _, err := cs.AppsV1().Deployments(d[0].GetNamespace()).Get(ctx, d[0].GetName(), metav1.GetOptions{}); err == nil {
					t.Errorf("Deployment %s exists after a dry run", d[0].GetName())
				}
			}
		})
	}
}

// checkKept fails if the field at path of sent is not in got as sent.
func checkKept(t *testing.T, sent, got *unstructured.Unstructured, path ...string) {
	t.Helper()
	want, _, _ := unstructured.NestedFieldNoCopy(sent.Object, path...)
	have, _, _ := unstructured.NestedFieldNoCopy(got.Object, path...)
	if want == nil {
		return
	}
	if !subset(want, have) {
		t.Errorf("%s %s: the server dropped or changed %s:\nsent %v\ngot  %v", sent.GetKind(), sent.GetName(), strings.Join(path, "."), want, have)
	}
}

// subset reports whether every field of want is in have with the same
// value (have may hold defaults besides).
func subset(want, have any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range w {
			if !subset(v, h[k]) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !subset(w[i], h[i]) {
				return false
			}
		}
		return true
	default:
		return want == have || (isNumber(want) && isNumber(have) && toFloat(want) == toFloat(have))
	}
}

func isNumber(v any) bool {
	switch v.(type) {
	case int64, float64, int32, int:
		return true
	}
	return false
}

func toFloat(v any) float64 {
	switch n := v.(type) {
	case int64:
		return float64(n)
	case int32:
		return float64(n)
	case int:
		return float64(n)
	case float64:
		return n
	}
	return 0
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// flagValue returns the value of --name=value in args ("" if absent).
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// kebab turns ValidatingWebhookConfiguration into
// validating-webhook-configuration.
func kebab(s string) string {
	var b strings.Builder
	for i, r := range s {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('-')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }
