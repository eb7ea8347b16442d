package cabundle

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// authorityReplicas is three replicas of one authority.Authority on one
// fake API server and one fake clock, each running a publisher of its own
// bundle into one MutatingWebhookConfiguration (observing its rotation, as
// controllerruntime.Add wires them), all with their real Run loops.
type authorityReplicas struct {
	kube *kubefake.Clientset
	clk  *clocktesting.FakeClock
	rec  *testRecorder
	as   []*authority.Authority
	ps   []*Publisher
	name string
}

// startAuthorityReplicas starts the replicas; the one numbered late (none
// when negative) reads the CA Secret late (quietSecretWatch).
func startAuthorityReplicas(t *testing.T, name string, late int) *authorityReplicas {
	t.Helper()
	w := &authorityReplicas{kube: kubefake.NewClientset(), clk: clocktesting.NewFakeClock(fakeStart), rec: &testRecorder{}, name: name}
	optimisticNamespaced(w.kube)
	enforceResourceVersions(t, w.kube, "mutatingwebhookconfigurations",
		func() k8sruntime.Object { return &admissionregistrationv1.MutatingWebhookConfiguration{} })
	if _, err := w.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(),
		mutatingWithBundle(name, nil), metav1.CreateOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	for r := range 3 {
		var client kubernetes.Interface = w.kube
		if r == late {
			client = quietSecretWatch{w.kube}
		}
		a, err := authority.New(authority.Config{
			Name: fmt.Sprintf("%s-r%d", name, r), Namespace: "ns", SecretName: "ca", Client: client,
			ReplicaID: fmt.Sprintf("r%d", r), Hosts: []string{"svc1.ns1.svc"}, Lifetime: 10 * time.Minute, Clock: w.clk,
		})
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewPublisher(PublisherConfig{
			Name: fmt.Sprintf("%s-p%d", name, r), Source: a, KubeClient: w.kube, Clock: w.clk, EventRecorder: w.rec,
			Targets: []Target{{Kind: MutatingWebhookConfiguration, Name: name}},
			Verify:  []dynamiccert.ServedChainLister{dynamiccert.ServedBy(a)},
		})
		if err != nil {
			t.Fatal(err)
		}
		a.AddObserver(p)
		runAuthority(t, a)
		runPublisher(t, p)
		w.as, w.ps = append(w.as, a), append(w.ps, p)
	}
	return w
}

// optimisticNamespaced makes the fake API server keep resourceVersions and
// enforce optimistic concurrency on the Authority's Secrets and Leases, as
// a real one does: an update whose resourceVersion is not the stored one
// is a Conflict. Without it the replicas' writes of one rotation step
// overwrite each other (the last writer wins) and each adds its own
// successor CA.
func optimisticNamespaced(client *kubefake.Clientset) {
	var mu sync.Mutex
	rv := 1000
	for _, r := range []struct {
		resource string
		gvr      schema.GroupVersionResource
		gr       schema.GroupResource
	}{
		{"secrets", corev1.SchemeGroupVersion.WithResource("secrets"), corev1.Resource("secrets")},
		{"leases", coordinationv1.SchemeGroupVersion.WithResource("leases"), coordinationv1.Resource("leases")},
	} {
		client.PrependReactor("create", r.resource, func(action clienttesting.Action) (bool, k8sruntime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			rv++
			action.(clienttesting.CreateAction).GetObject().(metav1.Object).SetResourceVersion(strconv.Itoa(rv))
			return false, nil, nil
		})
		client.PrependReactor("update", r.resource, func(action clienttesting.Action) (bool, k8sruntime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			obj := action.(clienttesting.UpdateAction).GetObject().(metav1.Object)
			stored, err := client.Tracker().Get(r.gvr, obj.GetNamespace(), obj.GetName())
			if err != nil {
				return false, nil, nil
			}
			if cur := stored.(metav1.Object).GetResourceVersion(); obj.GetResourceVersion() != cur {
				return true, nil, apierrors.NewConflict(r.gr, obj.GetName(), fmt.Errorf("resourceVersion %q is not %q", obj.GetResourceVersion(), cur))
			}
			rv++
			obj.SetResourceVersion(strconv.Itoa(rv))
			return false, nil, nil
		})
	}
}

// runAuthority runs a until the test ends.
func runAuthority(t *testing.T, a *authority.Authority) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx, 1); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the Authority's Run did not return within 30s of cancel")
		}
	})
}

func (w *authorityReplicas) step(d time.Duration) {
	w.clk.Step(d)
	settle(func() int { return len(w.kube.Actions()) })
}

// published returns the CAs of the object's caBundle.
func (w *authorityReplicas) published(t *testing.T) []string {
	t.Helper()
	o, err := w.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), w.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := o.Webhooks[0].ClientConfig.CABundle
	if len(b) == 0 {
		return nil
	}
	certs, err := pki.ParseCABundle(b)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range certs {
		out = append(out, authority.Fingerprint(c))
	}
	return out
}

// TestAuthorityReplicasNeverContestEachOther: three replicas of one
// Authority, each publishing its bundle into one webhook configuration
// (their only writers), go through an observed CA rotation asked for by
// the operator ([A] -> [A B]) and an emergency drill that marks A
// compromised (a fresh successor C replaces B and signs at once, then A
// leaves: [A B] -> [A C] -> [C]). Replica r2 reads the CA Secret late:
// its watch delivers nothing, so it learns of each step at its next GET,
// up to two minutes later, as a replica whose watch is slow does. Its
// bundle differs from the others' only in timing. No replica may count
// another's write as a change by another writer, become contested, or
// send CABundleContested. Before, the replica behind wrote its older
// bundle back after the 10 s grace, again and again, and the replicas
// ahead counted each as another writer's: contested within a minute,
// with a Warning Event naming evercert's own field manager.
func TestAuthorityReplicasNeverContestEachOther(t *testing.T) {
	w := startAuthorityReplicas(t, "one-authority", 2)
	for len(w.published(t)) == 0 || !w.agree() {
		w.step(time.Second)
	}
	first := w.published(t)
	t.Logf("first bundle %v", first)

	w.annotate(t, map[string]string{authority.RotateRequestedAnnotation: w.clk.Now().Format(time.RFC3339)})
	w.run(t, 3*time.Minute, func(cur []string) bool { return len(cur) > len(first) && w.agree() })

	compromised := w.as[0].Status().Signing.Fingerprint
	w.annotate(t, map[string]string{authority.CompromisedCAAnnotation: compromised, authority.CompromisedReasonAnnotation: "drill",
		authority.CompromisedAtAnnotation: w.clk.Now().Format(time.RFC3339)})
	w.run(t, 3*time.Minute, func(cur []string) bool {
		return len(cur) > 0 && !strings.Contains(strings.Join(cur, ","), compromised) && w.agree()
	})
	if ev := w.rec.find(reasonContested); len(ev) > 0 {
		t.Errorf("CABundleContested Events %+v, want none", ev)
	}
}

// TestAuthorityReplicasContestForeignWriter: next to three replicas of one
// Authority, another writer keeps putting its own bundle into the object:
// it is contested, and the Event names it.
func TestAuthorityReplicasContestForeignWriter(t *testing.T) {
	w := startAuthorityReplicas(t, "foreign-writer", -1)
	for len(w.published(t)) == 0 || !w.agree() {
		w.step(time.Second)
	}
	startCompetitor(t, w.kube, w.name, caAt(t, "rival", fakeStart), "rival")
	for i := 0; len(w.rec.find(reasonContested)) == 0; i++ {
		if i > 600 {
			t.Fatal("no CABundleContested Event after 10 minutes next to another writer")
		}
		w.step(time.Second)
	}
	if ev := w.rec.find(reasonContested); !strings.Contains(ev[0].note, "rival") {
		t.Errorf("contested Event %+v, want one naming rival", ev[0])
	}
}

// annotate sets annotations on the CA Secret, as the operator does.
func (w *authorityReplicas) annotate(t *testing.T, ann map[string]string) {
	t.Helper()
	secrets := w.kube.CoreV1().Secrets("ns")
	s, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	maps.Copy(s.Annotations, ann)
	if _, err := secrets.Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// run steps the clock a second at a time until done holds for the
// published bundle, then for another settle period, failing at once when
// a replica reports the object contested.
func (w *authorityReplicas) run(t *testing.T, settlePeriod time.Duration, done func(cur []string) bool) {
	t.Helper()
	last := fmt.Sprint(w.published(t))
	var doneAt time.Time
	for start := w.clk.Now(); doneAt.IsZero() || w.clk.Since(doneAt) < settlePeriod; {
		if w.clk.Since(start) > 30*time.Minute {
			t.Fatalf("not done after %v; the object holds %s", w.clk.Since(start), last)
		}
		w.step(time.Second)
		cur := w.published(t)
		if s := fmt.Sprint(cur); s != last {
			t.Logf("%v: bundle %v", w.clk.Since(fakeStart), cur)
			last = s
		}
		if doneAt.IsZero() && done(cur) {
			doneAt = w.clk.Now()
		}
		for r, p := range w.ps {
			if c := p.Contested(); len(c) > 0 {
				t.Fatalf("%v: replica %d reports %v contested; Events %+v", w.clk.Since(fakeStart), r, c, w.rec.find(reasonContested))
			}
		}
	}
}

// agree reports whether every replica's bundle is the object's.
func (w *authorityReplicas) agree() bool {
	o, err := w.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), w.name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, a := range w.as {
		if !bytes.Equal(a.CurrentCABundleContent(), o.Webhooks[0].ClientConfig.CABundle) {
			return false
		}
	}
	return true
}

// quietSecretWatch is a client whose Secret watches deliver nothing: its
// Authority reads the Secret only with GETs (secretReads' bound on a
// silent watch), so it learns of a change late.
type quietSecretWatch struct{ kubernetes.Interface }

// IsWatchListSemanticsUnSupported: the fake API server has no watch lists.
func (c quietSecretWatch) IsWatchListSemanticsUnSupported() bool { return true }

func (c quietSecretWatch) CoreV1() corev1client.CoreV1Interface {
	return quietCore{c.Interface.CoreV1()}
}

type quietCore struct{ corev1client.CoreV1Interface }

func (c quietCore) Secrets(ns string) corev1client.SecretInterface {
	return quietSecrets{c.CoreV1Interface.Secrets(ns)}
}

type quietSecrets struct{ corev1client.SecretInterface }

func (quietSecrets) Watch(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return watch.NewFake(), nil
}
