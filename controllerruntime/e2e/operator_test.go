//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/testcluster"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/controllerruntime/example/operator/webhooks"
)

const (
	operatorNS = "widget-operator-system"
	widgetNS   = "default"
	caSecret   = "widget-operator-ca" // the operator's caSecretName
	replicas   = 3
	// Lifetimes short enough for several CA rotations in a bounded run:
	// a leaf renews every ~13 s (RenewBefore Lifetime/3), a successor CA
	// is published every ~40 s (CARenewBefore CALifetime/3) and signs
	// after the propagation delay (2.5 s) once every replica trusts it and
	// every caBundle holds it.
	leafLifetime = 30 * time.Second
	caLifetime   = 60 * time.Second
	// wantRotations is how many CA rotations (a successor CA that starts
	// signing) the run must see.
	wantRotations = 3
	// runCap bounds the run from the replicas' start: it only guards
	// against a hang (three rotations take about 2.5 minutes).
	runCap = 6 * time.Minute
)

var (
	v1Widgets = schema.GroupVersionResource{Group: "example.evercert.io", Version: "v1", Resource: "widgets"}
	v2Widgets = schema.GroupVersionResource{Group: "example.evercert.io", Version: "v2", Resource: "widgets"}
	crds      = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	vwcs      = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}
	mwcs      = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"}
)

// TestE2EOperatorReplicas runs the sample operator, whose certificates come
// from the one evercert.Add call, as three replicas (separate processes)
// behind one address the kube-apiserver calls: the validating and mutating
// webhooks and the CRD's conversion webhook are registered with a URL
// clientConfig pointing at a round-robin TCP proxy that stands in for the
// operator's Service. Their caBundles are left empty: the replicas publish
// them.
//
// A client loop creates Widgets (at v1 and v2: mutating and validating
// webhooks, and conversion for v2), reads each back at v2 (conversion) and
// deletes it, and every tenth one is invalid and must be denied by the
// validating webhook. Through at least three CA rotations no call fails.
// While a successor CA is published but not yet signing, one replica is
// killed (SIGKILL) and restarted: conversion keeps answering while it is
// down, the restarted replica serves again and the rotation completes.
// Then the API requests each replica sends per minute are measured from
// its metrics endpoint.
func TestE2EOperatorReplicas(t *testing.T) {
	t.Parallel()
	env := startOperator(t, "--cert-lifetime="+leafLifetime.String(), "--ca-lifetime="+caLifetime.String())
	ctx, dyn, admin, reps, backends, proxy, ca, began, l := env.ctx, env.dyn, env.admin, env.reps, env.backends, env.proxy, env.ca, env.began, env.load
	loadDone := make(chan struct{})
	loadCtx, stopLoad := context.WithCancel(ctx)
	go func() { defer close(loadDone); l.run(loadCtx) }()
	t.Cleanup(func() { stopLoad(); <-loadDone })

	deadline := began.Add(runCap)
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v of the replicas' start; CA Secret history:\n%s", what, runCap, ca.history())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Kill one replica while a successor CA is published but does not
	// sign yet (next.crt in the Secret), after a first rotation.
	victim := reps[1]
	waitUntil("a first CA rotation", func() bool { return ca.rotations() >= 1 })
	waitUntil("a successor CA published after the first rotation", func() bool { return ca.pending() })
	l.pause.Lock() // no Widget call in flight at the kill
	secret, err := admin.CoreV1().Secrets(operatorNS).Get(ctx, caSecret, metav1.GetOptions{})
	require.NoError(t, err)
	require.Contains(t, secret.Data, authority.NextCertKey, "the successor CA is published and not signing at the kill")
	rotationsAtKill := ca.rotations()
	victim.kill(t)
	t.Logf("SIGKILLed %s %v after start, successor CA published and not signing (rotations so far: %d)",
		victim.name, time.Since(began).Round(100*time.Millisecond), rotationsAtKill)
	// The proxy closes the killed replica's connections towards the
	// kube-apiserver at once; a moment lets its transport drop them from
	// its idle pool before the next call (pacing, nothing is asserted on
	// it).
	time.Sleep(time.Second)
	l.pause.Unlock()

	// Conversion keeps answering while the replica is down: reads at v2
	// of a Widget stored at v1, on top of the load.
	survivor := newWidget(v1Widgets, "survivor", 3)
	_, err = dyn.Resource(v1Widgets).Namespace(widgetNS).Create(ctx, survivor, metav1.CreateOptions{})
	require.NoError(t, err, "create while a replica is down")
	for i := range 20 {
		w, err := dyn.Resource(v2Widgets).Namespace(widgetNS).Get(ctx, "survivor", metav1.GetOptions{})
		require.NoError(t, err, "read %d at v2 (conversion) while %s is down", i, victim.name)
		n, _, _ := unstructured.NestedInt64(w.Object, "spec", "replicas")
		require.EqualValues(t, 3, n, "converted v2 spec.replicas")
	}
	require.NoError(t, dyn.Resource(v1Widgets).Namespace(widgetNS).Delete(ctx, "survivor", metav1.DeleteOptions{}))
	servedByVictim := l.servedBy(victim.name)

	victim.start(t)
	waitUntil(victim.name+" ready again after its restart", func() bool {
		victim.retryLostPort(t) // its ports were free while it was down
		return victim.routable.Load()
	})
	secret, err = admin.CoreV1().Secrets(operatorNS).Get(ctx, caSecret, metav1.GetOptions{})
	require.NoError(t, err)
	_, pending := secret.Data[authority.NextCertKey]
	t.Logf("%s restarted and ready %v after start; successor CA still pending at its return: %v (rotations so far: %d)",
		victim.name, time.Since(began).Round(100*time.Millisecond), pending, ca.rotations())

	// Requests per replica per minute, over at least one minute from here
	// (rotations going on, no restarts).
	before := sampleRequests(t, ctx, reps)
	measureFrom := time.Now()

	waitUntil(fmt.Sprintf("%d CA rotations and one after the restart", wantRotations), func() bool {
		n := ca.rotations()
		return n >= wantRotations && n > rotationsAtKill
	})
	waitUntil(victim.name+" serving Widgets again", func() bool { return l.servedBy(victim.name) > servedByVictim })
	if rest := time.Minute - time.Since(measureFrom); rest > 0 {
		time.Sleep(rest) // the measurement window
	}
	after := sampleRequests(t, ctx, reps)
	logRequests(t, reps, before, after, time.Since(measureFrom), fmt.Sprintf("%v leaves and %v CAs, rotating", leafLifetime, caLifetime))

	stopLoad()
	<-loadDone
	ops, failures, denials := l.totals()
	t.Logf("%d CA rotations in %v; %d Widget iterations (%d denied as expected), %d failed; mutating webhook served by %v; proxy connections %s, %d without a backend",
		ca.rotations(), time.Since(began).Round(time.Second), ops, denials, failures, l.served(), proxyConns(backends), proxy.noRoute.Load())
	assert.Zero(t, failures, "failed calls; first failures:\n%s", strings.Join(l.firstErrors(), "\n"))
	assert.GreaterOrEqual(t, ca.rotations(), wantRotations, "CA rotations")
	assert.Zero(t, proxy.noRoute.Load(), "connections the proxy found no live replica for")
	for _, r := range reps {
		assert.Positive(t, l.servedBy(r.name), "Widgets mutated by %s", r.name)
	}
	t.Logf("CA Secret history:\n%s", ca.history())
}

// operatorEnv is a real kube-apiserver with the operator's CRD and webhook
// configurations, and three operator replicas behind the proxy, ready and
// answering.
type operatorEnv struct {
	ctx      context.Context
	admin    kubernetes.Interface
	dyn      dynamic.Interface
	reps     []*replica
	backends []*backend
	proxy    *roundRobin
	ca       *caWatch
	began    time.Time // the replicas' start
	load     *load
}

// startOperator builds the operator, starts a cluster, registers the CRD
// and webhooks on the proxy's URL and runs three replicas with args, and
// returns once every replica is ready and a Widget passed the webhooks.
func startOperator(t *testing.T, args ...string) *operatorEnv {
	t.Helper()
	bin := proctest.Build(t, "github.com/evercert/evercert/controllerruntime/example/operator")
	cluster := testcluster.Start(t)
	cfg := cluster.Config()
	env := &operatorEnv{admin: kubernetes.NewForConfigOrDie(cfg), dyn: dynamic.NewForConfigOrDie(cfg)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	env.ctx = ctx

	_, err := env.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNS}}, metav1.CreateOptions{})
	require.NoError(t, err)

	kubeconfig := writeKubeconfig(t, cfg)
	// All the replicas' ports in one call: chosen replica by replica, one
	// replica's ports were free again when the next chose (two of the 9
	// the same in 0.38% of tries, against 0.51% chosen one by one).
	ports := freePorts(t, 3*replicas)
	for i := range replicas {
		r := newReplica(t, bin, fmt.Sprintf("replica-%d", i), ports[3*i:3*i+3], append([]string{
			"--kubeconfig=" + kubeconfig, "--namespace=" + operatorNS,
			"--webhook-cert-hosts=127.0.0.1,widget-operator-webhook-service." + operatorNS + ".svc",
		}, args...)...)
		env.reps = append(env.reps, r)
		env.backends = append(env.backends, r.backend)
	}
	env.proxy = startProxy(t, env.backends)
	applyManifests(t, ctx, env.dyn, "https://"+env.proxy.addr())

	// The CA Secret's history, from a watch: rotations are counted there.
	env.ca = watchCA(t, ctx, env.admin)

	var probes sync.WaitGroup
	probeCtx, stopProbes := context.WithCancel(ctx)
	t.Cleanup(func() { stopProbes(); probes.Wait() })
	env.began = time.Now()
	for _, r := range env.reps {
		r.start(t)
		probes.Go(func() { r.probe(probeCtx) })
	}
	// A replica that lost one of its ports to another process before
	// binding it exits at once: it is started again on new ports
	// (retryLostPort), and one that exits for another reason fails the
	// test now, with its log, rather than after the wait.
	for readyBy := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		all := true
		for _, r := range env.reps {
			r.retryLostPort(t)
			all = all && r.routable.Load()
		}
		if all {
			break
		}
		if time.Now().After(readyBy) {
			// The reasons are read now: require.Eventually's message
			// arguments were evaluated before any probe had run.
			t.Fatalf("the replicas did not all become ready (/readyz) within 2m: %s", notReadyReasons(env.reps))
		}
	}
	t.Logf("%d replicas ready %v after start", replicas, time.Since(env.began).Round(100*time.Millisecond))

	// The kube-apiserver picks up the published caBundles from its own
	// watches, a moment after the replicas read them back; the load is
	// counted from the first call that passes all three webhooks.
	env.load = &load{dyn: env.dyn, byReplica: map[string]int{}}
	warmup := 0
	require.Eventually(t, func() bool {
		warmup++
		return env.load.iteration(ctx, 0, true) == nil
	}, time.Minute, 200*time.Millisecond, "no Widget passed the webhooks")
	t.Logf("webhooks answering after %d warm-up attempt(s)", warmup)
	return env
}

// TestE2EOperatorSteadyState measures the API requests each replica of the
// operator sends per minute at steady state with evercert's default
// lifetimes (7-day leaves, 56-day CAs): three replicas, ready and answering,
// over two minutes after a settling pause. It logs the numbers (no timed
// assertion); the replicas must stay ready throughout.
func TestE2EOperatorSteadyState(t *testing.T) {
	t.Parallel()
	env := startOperator(t)
	// Settling: the start-up lists and watches are behind us.
	time.Sleep(20 * time.Second)
	before := sampleRequests(t, env.ctx, env.reps)
	from := time.Now()
	refusedBefore := make([]int64, len(env.reps))
	for i, r := range env.reps {
		refusedBefore[i] = r.refusals.Load()
	}
	notReady := map[string]string{}
	for time.Since(from) < steadyWindow {
		for _, r := range env.reps {
			if !r.routable.Load() {
				notReady[r.name] = r.lastNotReady()
			}
		}
		time.Sleep(time.Second)
	}
	after := sampleRequests(t, env.ctx, env.reps)
	logRequests(t, env.reps, before, after, time.Since(from), "evercert's default lifetimes (7-day leaves, 56-day CAs), no rotation due")
	assert.Empty(t, notReady, "replicas not ready during the measurement")
	// The failure threshold hides a short blip from routable; a replica
	// that said it was not ready even once is still a failure here.
	for i, r := range env.reps {
		assert.Zero(t, r.refusals.Load()-refusedBefore[i], "/readyz answers of %s naming a failed check during the measurement (last: %q)", r.name, r.lastNotReady())
	}
	require.NoError(t, env.load.iteration(env.ctx, 1, false), "a Widget after the measurement")
}

// notReadyReasons says, for each replica not routable now, its last failed
// probe.
func notReadyReasons(reps []*replica) string {
	var out []string
	for _, r := range reps {
		if !r.routable.Load() {
			out = append(out, fmt.Sprintf("%s: %q", r.name, r.lastNotReady()))
		}
	}
	return strings.Join(out, "; ")
}

// steadyWindow is how long TestE2EOperatorSteadyState counts requests:
// replicas renew their Lease once a minute with the default lifetimes.
const steadyWindow = 2 * time.Minute

// logRequests logs each replica's API requests per minute between two
// samples, in total and by method.
func logRequests(t *testing.T, reps []*replica, before, after []requestSample, window time.Duration, at string) {
	t.Helper()
	minutes := window.Minutes()
	for i, r := range reps {
		var methods []string
		for _, m := range slices.Sorted(maps.Keys(after[i].byMethod)) {
			methods = append(methods, fmt.Sprintf("%s %.1f", m, (after[i].byMethod[m]-before[i].byMethod[m])/minutes))
		}
		t.Logf("API requests of %s: %.1f per minute over %.1f min (%s), at %s",
			r.name, (after[i].total-before[i].total)/minutes, minutes, strings.Join(methods, ", "), at)
	}
}

func proxyConns(bs []*backend) string {
	var parts []string
	for _, b := range bs {
		parts = append(parts, fmt.Sprintf("%s %d", b.name, b.conns.Load()))
	}
	return strings.Join(parts, ", ")
}

type requestSample struct {
	total    float64
	byMethod map[string]float64
}

func sampleRequests(t *testing.T, ctx context.Context, reps []*replica) []requestSample {
	t.Helper()
	var out []requestSample
	for _, r := range reps {
		total, byMethod, err := r.restRequests(ctx)
		require.NoError(t, err)
		out = append(out, requestSample{total, byMethod})
	}
	return out
}

// writeKubeconfig writes cfg as a kubeconfig file for the operator's
// --kubeconfig.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, TLSServerName: cfg.ServerName}
	kc.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	kc.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// applyManifests creates the operator's CRD and webhook configurations from
// its config/ directory, with the Service in each clientConfig replaced by
// a URL on the proxy (the test has no Service routing), and waits for the
// CRD to be served.
func applyManifests(t *testing.T, ctx context.Context, dyn dynamic.Interface, url string) {
	t.Helper()
	for _, file := range []string{"crd/example.evercert.io_widgets.yaml", "webhook/manifests.yaml"} {
		raw, err := os.ReadFile(filepath.Join("..", "example", "operator", "config", file))
		require.NoError(t, err)
		for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
			obj := &unstructured.Unstructured{}
			require.NoError(t, yaml.Unmarshal(doc, &obj.Object), file)
			var gvr schema.GroupVersionResource
			switch obj.GetKind() {
			case "CustomResourceDefinition":
				gvr = crds
				cc, _, _ := unstructured.NestedMap(obj.Object, "spec", "conversion", "webhook", "clientConfig")
				require.NoError(t, unstructured.SetNestedMap(obj.Object, urlClientConfig(t, cc, url), "spec", "conversion", "webhook", "clientConfig"))
			case "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration":
				gvr = vwcs
				if obj.GetKind() == "MutatingWebhookConfiguration" {
					gvr = mwcs
				}
				hooks, _, _ := unstructured.NestedSlice(obj.Object, "webhooks")
				for i := range hooks {
					h := hooks[i].(map[string]any)
					h["clientConfig"] = urlClientConfig(t, h["clientConfig"].(map[string]any), url)
				}
				require.NoError(t, unstructured.SetNestedSlice(obj.Object, hooks, "webhooks"))
			default:
				t.Fatalf("%s: unexpected kind %q", file, obj.GetKind())
			}
			_, err := dyn.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{})
			require.NoError(t, err, "create %s %s", obj.GetKind(), obj.GetName())
		}
	}
	require.Eventually(t, func() bool {
		_, err := dyn.Resource(v1Widgets).Namespace(widgetNS).List(ctx, metav1.ListOptions{})
		return err == nil
	}, time.Minute, 100*time.Millisecond, "the Widget CRD is not served")
}

// urlClientConfig turns a Service clientConfig into a URL one with the same
// path, keeping an empty caBundle for the replicas to fill in.
func urlClientConfig(t *testing.T, cc map[string]any, url string) map[string]any {
	t.Helper()
	path, _, _ := unstructured.NestedString(cc, "service", "path")
	require.NotEmpty(t, path, "clientConfig.service.path")
	return map[string]any{"url": url + path}
}

// caWatch follows the CA Secret through a watch and keeps its history: a
// rotation is tls.crt (the signing CA) changing to another CA.
type caWatch struct {
	mu      sync.Mutex
	signing string // fingerprint of tls.crt
	next    bool   // next.crt present: a successor published, not signing
	rotated int
	events  []string
}

func fingerprint(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:4])
}

func watchCA(t *testing.T, ctx context.Context, admin kubernetes.Interface) *caWatch {
	t.Helper()
	w := &caWatch{}
	factory := informers.NewSharedInformerFactoryWithOptions(admin, 0, informers.WithNamespace(operatorNS),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", caSecret).String()
		}))
	inf := factory.Core().V1().Secrets().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj) },
		UpdateFunc: func(_, obj any) { w.observe(obj) },
	})
	require.NoError(t, err)
	watchCtx, stop := context.WithCancel(ctx)
	factory.Start(watchCtx.Done())
	t.Cleanup(func() { stop(); factory.Shutdown() })
	return w
}

func (w *caWatch) observe(obj any) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	signing := fingerprint(s.Data[corev1.TLSCertKey])
	_, next := s.Data[authority.NextCertKey]
	if w.signing != "" && signing != w.signing {
		w.rotated++
	}
	if signing != w.signing || next != w.next {
		w.events = append(w.events, fmt.Sprintf("%s rv %s: signing CA %s, successor published: %v, rotations %d",
			time.Now().Format("15:04:05.000"), s.ResourceVersion, signing, next, w.rotated))
	}
	w.signing, w.next = signing, next
}

func (w *caWatch) rotations() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rotated
}

func (w *caWatch) pending() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next
}

func (w *caWatch) history() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.events, "\n")
}

// load is the client loop: the kube-apiserver calls the webhooks for it.
type load struct {
	dyn   dynamic.Interface
	pause sync.RWMutex // held for writing while a replica is killed

	ops, failures, denials, warmups atomic.Int64
	mu                              sync.Mutex
	errs                            []string
	byReplica                       map[string]int // Widgets mutated, by replica
}

func newWidget(gvr schema.GroupVersionResource, name string, size int64) *unstructured.Unstructured {
	spec := map[string]any{}
	if size != 0 {
		field := "size"
		if gvr.Version == "v2" {
			field = "replicas"
		}
		spec[field] = size
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": "Widget",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

func (l *load) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		l.pause.RLock()
		err := l.iteration(ctx, i, false)
		l.pause.RUnlock()
		if ctx.Err() != nil {
			return // stopped mid-call: not a failure
		}
		l.ops.Add(1)
		if err != nil {
			l.failures.Add(1)
			l.mu.Lock()
			if len(l.errs) < 20 {
				l.errs = append(l.errs, time.Now().Format("15:04:05.000")+" "+err.Error())
			}
			l.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond): // pacing
		}
	}
}

// iteration creates one Widget (at v1 or v2: the mutating and validating
// webhooks, and conversion at v2), reads it at v2 (conversion) and deletes
// it. Every tenth is invalid and must be denied. warmup counts nothing.
func (l *load) iteration(ctx context.Context, i int, warmup bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	gvr := v1Widgets
	if i%2 == 1 {
		gvr = v2Widgets
	}
	name := fmt.Sprintf("w-%06d", i)
	if warmup {
		name = fmt.Sprintf("warmup-%d", l.warmups.Add(1))
	}
	widgets := l.dyn.Resource(gvr).Namespace(widgetNS)
	if i%10 == 9 {
		_, err := widgets.Create(ctx, newWidget(gvr, name, 11), metav1.CreateOptions{})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), `admission webhook "vwidget-v1.kb.io" denied the request`) &&
			strings.Contains(err.Error(), "must be between 1 and 10") {
			l.denials.Add(1)
			return nil
		}
		return fmt.Errorf("create invalid %s at %s: want a denial by the validating webhook, got %v", name, gvr.Version, err)
	}
	size := int64(i%10 + 1)
	if i%3 == 0 {
		size = 0 // the mutating webhook sets the default, 1
	}
	created, err := widgets.Create(ctx, newWidget(gvr, name, size), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create %s at %s: %w", name, gvr.Version, err)
	}
	by := created.GetAnnotations()[webhooks.MutatedByAnnotation]
	if by == "" {
		return fmt.Errorf("create %s at %s: not mutated (annotations %v)", name, gvr.Version, created.GetAnnotations())
	}
	if !warmup {
		l.mu.Lock()
		l.byReplica[by]++
		l.mu.Unlock()
	}
	want := max(size, 1)
	got, err := l.dyn.Resource(v2Widgets).Namespace(widgetNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get %s at v2: %w", name, err)
	}
	n, _, _ := unstructured.NestedInt64(got.Object, "spec", "replicas")
	colour, _, _ := unstructured.NestedString(got.Object, "spec", "colour")
	if n != want || colour != "blue" {
		return fmt.Errorf("get %s at v2: spec %v, want replicas %d and the default colour blue", name, got.Object["spec"], want)
	}
	if err := l.dyn.Resource(v1Widgets).Namespace(widgetNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

func (l *load) totals() (ops, failures, denials int64) {
	return l.ops.Load(), l.failures.Load(), l.denials.Load()
}

func (l *load) firstErrors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

func (l *load) servedBy(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byReplica[name]
}

func (l *load) served() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for k, v := range l.byReplica {
		out[k] = v
	}
	return out
}
