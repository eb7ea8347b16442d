package cabundle

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
)

// BenchmarkPublisherScale measures the publisher with 1,000
// ValidatingWebhookConfigurations selected by one label selector (one
// webhook each), beside 1,000 that it does not select, on the fake
// clientset, through Run:
//
//   - requests-to-publish: the API requests it sends from Run to every
//     selected object holding the bundle (the informer's list and watch
//     included); writes-to-publish the patches among them;
//   - requests-per-resync: the requests of one resync of the unchanged
//     objects (the fake clock stepped by Resync), at rest;
//   - requests-per-rotation: the requests from a new bundle to every object
//     holding it;
//   - heap-MiB: the heap it holds then (runtime.MemStats.HeapAlloc after a
//     GC, before NewPublisher and after the rotation; the fake's objects
//     are made before and not counted, but the fake tracker's copies of the
//     written objects are), and B/target the same per selected object.
//
// The requests per verb and resource are logged with -v.
func BenchmarkPublisherScale(b *testing.B) {
	klog.LogToStderr(false)
	defer klog.LogToStderr(true)
	const targets = 1000
	sel := map[string]string{"evercert.test/inject": "yes"}
	var (
		publish, writes, resync, rotation float64
		heap                              float64
		runs                              int
	)
	for b.Loop() {
		runs++
		var objs []k8sruntime.Object
		for i := range 2 * targets {
			lbls := map[string]string{"app": "other"}
			if i%2 == 0 {
				lbls = sel
			}
			objs = append(objs, &admissionregistrationv1.ValidatingWebhookConfiguration{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vwc-%d", i), Labels: lbls},
				Webhooks: []admissionregistrationv1.ValidatingWebhook{{
					Name: fmt.Sprintf("v%d.example.com", i),
					ClientConfig: admissionregistrationv1.WebhookClientConfig{
						Service: &admissionregistrationv1.ServiceReference{Namespace: "ns1", Name: "svc1"}},
					SideEffects:             ptrTo(admissionregistrationv1.SideEffectClassNone),
					AdmissionReviewVersions: []string{"v1"},
				}},
			})
		}
		f := fakeClients{kube: kubefake.NewClientset(objs...)}
		objs = nil
		clk := clocktesting.NewFakeClock(fakeStart)
		source := newTestCA(newBundle(b, "first"))
		cfg := f.config(source, false, Target{Kind: ValidatingWebhookConfiguration, Selector: labels.SelectorFromSet(sel)})
		cfg.Clock = clk
		before := heapAfterGC()

		p, err := NewPublisher(cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.Run(ctx, 0)
		}()
		actions := func() []clienttesting.Action { return f.kube.Actions() }
		holding := func(bundle []byte) int {
			// Through the tracker, which records no action.
			list, err := f.kube.Tracker().List(admissionregistrationv1.SchemeGroupVersion.WithResource("validatingwebhookconfigurations"),
				admissionregistrationv1.SchemeGroupVersion.WithKind("ValidatingWebhookConfiguration"), "")
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for _, o := range list.(*admissionregistrationv1.ValidatingWebhookConfigurationList).Items {
				if bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, bundle) {
					n++
				}
			}
			return n
		}
		waitHolding := func(bundle []byte) {
			deadline := time.Now().Add(5 * time.Minute)
			for holding(bundle) < targets {
				if time.Now().After(deadline) {
					b.Fatalf("%d of %d objects hold the bundle after 5 minutes", holding(bundle), targets)
				}
				time.Sleep(20 * time.Millisecond)
			}
			settle(func() int { return len(actions()) })
		}

		first := source.CurrentCABundleContent()
		waitHolding(first)
		all := actions()
		publish += float64(len(all))
		writes += float64(countVerb(all, "patch"))
		logActions(b, "publish", all)

		// At rest: one resync of unchanged objects.
		n := len(actions())
		clk.Step(DefaultResync)
		settle(func() int { return len(actions()) })
		time.Sleep(100 * time.Millisecond)
		settle(func() int { return len(actions()) })
		resync += float64(len(actions()) - n)
		logActions(b, "resync", actions()[n:])

		// A rotation.
		n = len(actions())
		second := newBundle(b, "second")
		source.set(second)
		waitHolding(second)
		rotation += float64(len(actions()) - n)
		logActions(b, "rotation", actions()[n:])

		heap += float64(heapAfterGC() - before)
		cancel()
		<-done
		runtime.KeepAlive(f)
	}
	b.ReportMetric(publish/float64(runs), "requests-to-publish")
	b.ReportMetric(writes/float64(runs), "writes-to-publish")
	b.ReportMetric(resync/float64(runs), "requests-per-resync")
	b.ReportMetric(rotation/float64(runs), "requests-per-rotation")
	b.ReportMetric(heap/float64(runs)/(1<<20), "heap-MiB")
	b.ReportMetric(heap/float64(runs)/targets, "B/target")
}

func ptrTo[T any](v T) *T { return &v }

func countVerb(actions []clienttesting.Action, verb string) int {
	n := 0
	for _, a := range actions {
		if a.GetVerb() == verb {
			n++
		}
	}
	return n
}

// logActions logs the requests per verb and resource.
func logActions(b *testing.B, what string, actions []clienttesting.Action) {
	per := map[string]int{}
	for _, a := range actions {
		per[a.GetVerb()+" "+a.GetResource().Resource]++
	}
	var lines []string
	for k, v := range per {
		lines = append(lines, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(lines)
	b.Logf("%s: %d requests: %s", what, len(actions), strings.Join(lines, ", "))
}

// heapAfterGC returns the bytes of live heap objects after a full GC.
func heapAfterGC() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
