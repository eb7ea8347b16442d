package cabundle

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsfake "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/fake"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorfake "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset/fake"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/logtest"
)

// fakeClients holds one fake clientset per API group.
type fakeClients struct {
	kube *kubefake.Clientset
	ext  *apiextensionsfake.Clientset
	agg  *aggregatorfake.Clientset
}

func (f fakeClients) config(source *testCA, ssa bool, targets ...Target) PublisherConfig {
	return PublisherConfig{
		Source: source, Targets: targets, UseServerSideApply: ssa,
		KubeClient: f.kube, APIExtensionsClient: f.ext, AggregatorClient: f.agg,
	}
}

// patches returns the patch actions recorded by all fakes.
func (f fakeClients) patches() []clienttesting.PatchAction {
	var all []clienttesting.Action
	if f.kube != nil {
		all = append(all, f.kube.Actions()...)
	}
	if f.ext != nil {
		all = append(all, f.ext.Actions()...)
	}
	if f.agg != nil {
		all = append(all, f.agg.Actions()...)
	}
	var out []clienttesting.PatchAction
	for _, a := range all {
		if p, ok := a.(clienttesting.PatchAction); ok {
			out = append(out, p)
		}
	}
	return out
}

func crdFixture(name string, lbls map[string]string, strategy apiextensionsv1.ConversionStrategyType, bundle []byte) *apiextensionsv1.CustomResourceDefinition {
	conv := &apiextensionsv1.CustomResourceConversion{Strategy: strategy}
	if strategy == apiextensionsv1.WebhookConverter {
		conv.Webhook = &apiextensionsv1.WebhookConversion{
			ClientConfig: &apiextensionsv1.WebhookClientConfig{
				Service:  &apiextensionsv1.ServiceReference{Namespace: "ns1", Name: "svc1"},
				CABundle: bundle,
			},
			ConversionReviewVersions: []string{"v1"},
		}
	}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec:       apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Conversion: conv},
	}
}

func apiServiceFixture(name string, lbls map[string]string, bundle []byte) *apiregistrationv1.APIService {
	return &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec: apiregistrationv1.APIServiceSpec{
			Service:              &apiregistrationv1.ServiceReference{Namespace: "ns1", Name: "svc1"},
			Group:                "example.com",
			Version:              "v1",
			GroupPriorityMinimum: 1000,
			VersionPriority:      15,
			CABundle:             bundle,
		},
	}
}

// runPublisher starts p and returns a function that stops it and checks
// that Run returned nil.
func runPublisher(t *testing.T, p *Publisher) (stop func()) {
	t.Helper()
	return runPublisherIn(t, context.Background(), p)
}

// runPublisherIn is runPublisher with Run's parent context, for a test that
// gives the publisher a logger (internal/logtest).
func runPublisherIn(t *testing.T, parent context.Context, p *Publisher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() { p.Run(ctx, 0); close(done) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return within 10s of cancel")
		}
	}
	t.Cleanup(stop)
	return stop
}

func waitReady(t *testing.T, p *Publisher, timeout time.Duration) {
	t.Helper()
	if !waitSynced(p, timeout) {
		t.Fatalf("HasSynced not true within %v", timeout)
	}
}

func TestPublisherWithFakes(t *testing.T) {
	old := newBundle(t, "old")
	bundle := newBundle(t, "ca-1")
	ctx := context.Background()

	// The fake tracker never changes an object's resourceVersion, so a
	// fixed one would make every later version look like the one the
	// publisher wrote over; leave it empty, as the fake's own objects are.
	vwc := vwcFixture(old, nil)
	vwc.ResourceVersion = ""
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "mwc"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{Name: "m.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "ns1", Name: "svc1"}}},
		},
	}
	sel := map[string]string{"evercert.test/inject": "yes"}
	f := fakeClients{
		kube: kubefake.NewClientset(vwc, mwc),
		ext: apiextensionsfake.NewClientset(
			crdFixture("foos.example.com", nil, apiextensionsv1.WebhookConverter, nil),
			// Selected by label but without a webhook: skipped quietly.
			crdFixture("bars.example.com", sel, apiextensionsv1.NoneConverter, nil),
			crdFixture("bazs.example.com", sel, apiextensionsv1.WebhookConverter, old),
		),
		// Already right: must not be written.
		agg: aggregatorfake.NewClientset(apiServiceFixture("v1.example.com", nil, bundle)),
	}
	source := newTestCA(bundle)
	before := map[Kind]map[string]float64{}
	for _, k := range []Kind{ValidatingWebhookConfiguration, MutatingWebhookConfiguration, CustomResourceDefinition, APIService} {
		before[k] = publishCounts(t, k)
	}

	p, err := NewPublisher(f.config(source, false,
		Target{Kind: ValidatingWebhookConfiguration, Name: "vwc", Service: &ServiceRef{Namespace: "ns1", Name: "svc1"}},
		Target{Kind: MutatingWebhookConfiguration, Name: "mwc"},
		Target{Kind: CustomResourceDefinition, Name: "foos.example.com"},
		Target{Kind: CustomResourceDefinition, Selector: labels.SelectorFromSet(sel)},
		Target{Kind: APIService, Name: "v1.example.com"},
	))
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	waitReady(t, p, 10*time.Second)

	getVWC := func() *admissionregistrationv1.ValidatingWebhookConfiguration {
		o, err := f.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "vwc", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	getCRD := func(name string) *apiextensionsv1.CustomResourceDefinition {
		o, err := f.ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	got := getVWC()
	for i, want := range [][]byte{bundle, old, nil, bundle} {
		if !bytes.Equal(got.Webhooks[i].ClientConfig.CABundle, want) {
			t.Errorf("webhook %s: caBundle %.20q, want %.20q", got.Webhooks[i].Name, got.Webhooks[i].ClientConfig.CABundle, want)
		}
	}
	m, _ := f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "mwc", metav1.GetOptions{})
	if !bytes.Equal(m.Webhooks[0].ClientConfig.CABundle, bundle) {
		t.Errorf("mutating webhook not published")
	}
	for _, name := range []string{"foos.example.com", "bazs.example.com"} {
		if !bytes.Equal(getCRD(name).Spec.Conversion.Webhook.ClientConfig.CABundle, bundle) {
			t.Errorf("CRD %s not published", name)
		}
	}
	if c := getCRD("bars.example.com").Spec.Conversion; c.Webhook != nil {
		t.Errorf("CRD with strategy None got a webhook: %+v", c.Webhook)
	}

	// Only JSON patches, only caBundle paths, nothing for the APIService
	// that was already right or the CRD without webhook.
	patched := map[string]bool{}
	for _, a := range f.patches() {
		if a.GetPatchType() != types.JSONPatchType {
			t.Errorf("patch %s/%s of type %s", a.GetResource().Resource, a.GetName(), a.GetPatchType())
		}
		for _, op := range decodeOps(t, a.GetPatch()) {
			if op.Path != "/metadata/resourceVersion" && !strings.HasSuffix(op.Path, "/caBundle") {
				t.Errorf("patch of %s touches %s", a.GetName(), op.Path)
			}
		}
		patched[a.GetName()] = true
	}
	for _, name := range []string{"v1.example.com", "bars.example.com"} {
		if patched[name] {
			t.Errorf("%s was patched, want no write", name)
		}
	}
	if d := countsDelta(before[APIService], publishCounts(t, APIService)); d[resultUnchanged] < 1 || d[resultSuccess] != 0 {
		t.Errorf("APIService metrics delta %v, want unchanged only", d)
	}
	if d := countsDelta(before[CustomResourceDefinition], publishCounts(t, CustomResourceDefinition)); d[resultSuccess] < 2 || d[resultError] != 0 {
		// At least: without resourceVersions (fakes) the cache-lag guard
		// is off, and an event racing the first write may write again.
		t.Errorf("CRD metrics delta %v, want 2 successes", d)
	}

	// A new bundle is published everywhere.
	bundle2 := newBundle(t, "ca-2")
	source.set(bundle2)
	eventually(t, 5*time.Second, "new bundle in every object", func() bool {
		a, err := f.agg.ApiregistrationV1().APIServices().Get(ctx, "v1.example.com", metav1.GetOptions{})
		return err == nil && bytes.Equal(a.Spec.CABundle, bundle2) &&
			bytes.Equal(getVWC().Webhooks[0].ClientConfig.CABundle, bundle2) &&
			bytes.Equal(getCRD("bazs.example.com").Spec.Conversion.Webhook.ClientConfig.CABundle, bundle2)
	})

	// Drift: someone writes another bundle; it is written back.
	o := getVWC()
	o.Webhooks[0].ClientConfig.CABundle = old
	if _, err := f.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, o, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "drift repaired", func() bool {
		return bytes.Equal(getVWC().Webhooks[0].ClientConfig.CABundle, bundle2)
	})

	// A new object matching the selector is picked up.
	if _, err := f.ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx,
		crdFixture("quxs.example.com", sel, apiextensionsv1.WebhookConverter, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "new selected CRD published", func() bool {
		return bytes.Equal(getCRD("quxs.example.com").Spec.Conversion.Webhook.ClientConfig.CABundle, bundle2)
	})
}

func TestPublisherWaitsForMissingObject(t *testing.T) {
	bundle := newBundle(t, "ca")
	f := fakeClients{kube: kubefake.NewClientset()}
	p, err := NewPublisher(f.config(newTestCA(bundle), false, Target{Kind: MutatingWebhookConfiguration, Name: "later"}))
	if err != nil {
		t.Fatal(err)
	}
	_, ctx, logs := logtest.New(t)
	runPublisherIn(t, ctx, p)
	if waitSynced(p, 300*time.Millisecond) {
		t.Fatal("HasSynced true while the object does not exist")
	}
	// The wait is logged, and the health check says what is awaited.
	eventually(t, 5*time.Second, "the wait is logged", func() bool { return logs.Infos("Waiting for the object to exist") == 1 })
	const want = "MutatingWebhookConfiguration/later: not published yet (waiting: missing)"
	if err := p.HealthCheck().Check(nil); err == nil || err.Error() != want {
		t.Errorf("health check %v, want %q", err, want)
	}
	if _, err := f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(),
		&admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "later"},
			Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "w.example.com"}},
		}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, 5*time.Second)
	o, _ := f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "later", metav1.GetOptions{})
	if !bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, bundle) {
		t.Error("object created later was not published")
	}

	// Deleted and created again: the bookkeeping is dropped with the
	// object, and the new one is published too.
	mwcs := f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if err := mwcs.Delete(context.Background(), "later", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "bookkeeping dropped", func() bool {
		p.writes.mu.Lock()
		defer p.writes.mu.Unlock()
		_, ok := p.writes.last[objectKey(MutatingWebhookConfiguration, "later")]
		return !ok
	})
	if _, err := mwcs.Create(context.Background(), &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "later"},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "w2.example.com"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "re-created object published", func() bool {
		o, err := mwcs.Get(context.Background(), "later", metav1.GetOptions{})
		return err == nil && bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, bundle)
	})
}

func TestPublisherErrorsAndConflictsAreRetried(t *testing.T) {
	bundle := newBundle(t, "ca")
	f := fakeClients{agg: aggregatorfake.NewClientset(apiServiceFixture("v1.example.com", nil, nil))}
	// Two conflicts, then forbidden twice, then let it through.
	gr := schema.GroupResource{Group: "apiregistration.k8s.io", Resource: "apiservices"}
	failures := []error{
		apierrors.NewConflict(gr, "v1.example.com", errors.New("the object has been modified")),
		apierrors.NewConflict(gr, "v1.example.com", errors.New("the object has been modified")),
		apierrors.NewForbidden(gr, "v1.example.com", errors.New("no patch for you")),
		apierrors.NewForbidden(gr, "v1.example.com", errors.New("no patch for you")),
	}
	f.agg.PrependReactor("patch", "apiservices", func(clienttesting.Action) (bool, k8sruntime.Object, error) {
		if len(failures) == 0 {
			return false, nil, nil
		}
		err := failures[0]
		failures = failures[1:]
		return true, nil, err
	})
	before := publishCounts(t, APIService)
	p, err := NewPublisher(f.config(newTestCA(bundle), false, Target{Kind: APIService, Name: "v1.example.com"}))
	if err != nil {
		t.Fatal(err)
	}
	_, ctx, logs := logtest.New(t)
	runPublisherIn(t, ctx, p)
	// Backoff: 100+200+400+800 ms before the fifth attempt.
	waitReady(t, p, 10*time.Second)
	d := countsDelta(before, publishCounts(t, APIService))
	if d[resultConflict] != 2 || d[resultError] != 2 || d[resultSuccess] != 1 {
		t.Errorf("metrics delta %v, want 2 conflicts, 2 errors, 1 success", d)
	}
	// The same forbidden twice is one error line, the success after it one
	// recovery line; conflicts are expected and not errors.
	if n := logs.Errors("Failed to publish caBundle"); n != 1 {
		t.Errorf("%d error lines for one error retried twice, want 1:\n%s", n, logs)
	}
	if n := logs.Infos("caBundle publishing recovered"); n != 1 {
		t.Errorf("%d recovery lines, want 1:\n%s", n, logs)
	}
}

func TestPublisherServerSideApplyWithFakes(t *testing.T) {
	old := newBundle(t, "old")
	bundle := newBundle(t, "ca")
	vwc := vwcFixture(old, nil)
	vwc.ResourceVersion = ""
	f := fakeClients{kube: kubefake.NewClientset(vwc)}
	p, err := NewPublisher(f.config(newTestCA(bundle), true,
		Target{Kind: ValidatingWebhookConfiguration, Name: "vwc", Service: &ServiceRef{Namespace: "ns1", Name: "svc1"}}))
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	waitReady(t, p, 10*time.Second)
	for _, a := range f.patches() {
		if a.GetPatchType() != types.ApplyPatchType {
			t.Errorf("patch type %s, want apply", a.GetPatchType())
		}
	}
	got, err := f.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), "vwc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Webhooks) != 4 {
		t.Fatalf("apply changed the number of webhooks to %d", len(got.Webhooks))
	}
	for i, want := range [][]byte{bundle, old, nil, bundle} {
		wh := got.Webhooks[i]
		if !bytes.Equal(wh.ClientConfig.CABundle, want) {
			t.Errorf("webhook %s: caBundle %.20q, want %.20q", wh.Name, wh.ClientConfig.CABundle, want)
		}
	}
	if got.Webhooks[1].ClientConfig.Service == nil || got.Webhooks[2].ClientConfig.URL == nil {
		t.Errorf("apply clobbered client configs: %+v", got.Webhooks)
	}
}

func TestPublisherWithStaticCA(t *testing.T) {
	// dynamiccert's static provider never notifies; the initial sync alone
	// must publish.
	bundle := newBundle(t, "static")
	source, err := dynamiccert.NewStaticCA("static", bundle)
	if err != nil {
		t.Fatal(err)
	}
	f := fakeClients{agg: aggregatorfake.NewClientset(apiServiceFixture("v1.example.com", nil, nil))}
	p, err := NewPublisher(PublisherConfig{Source: source, AggregatorClient: f.agg, Targets: []Target{{Kind: APIService, Name: "v1.example.com"}}})
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	waitReady(t, p, 10*time.Second)
	a, _ := f.agg.ApiregistrationV1().APIServices().Get(context.Background(), "v1.example.com", metav1.GetOptions{})
	if !bytes.Equal(a.Spec.CABundle, bundle) {
		t.Error("static bundle not published")
	}
}

func TestPublisherEmptyBundleIsNeverWritten(t *testing.T) {
	f := fakeClients{agg: aggregatorfake.NewClientset(apiServiceFixture("v1.example.com", nil, []byte("keep")))}
	source := newTestCA(nil)
	p, err := NewPublisher(f.config(source, false, Target{Kind: APIService, Name: "v1.example.com"}))
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	time.Sleep(300 * time.Millisecond)
	if n := len(f.patches()); n != 0 {
		t.Fatalf("%d writes with an empty bundle", n)
	}
	bundle := newBundle(t, "ca")
	source.set(bundle)
	waitReady(t, p, 5*time.Second)
}

func TestNewRejectsBadConfig(t *testing.T) {
	src := newTestCA([]byte("x"))
	ok := Target{Kind: APIService, Name: "x"}
	for _, tc := range []struct {
		name    string
		cfg     PublisherConfig
		wantErr string
	}{
		{"no source", PublisherConfig{Targets: []Target{ok}}, "PublisherConfig.Source is required"},
		{"no targets", PublisherConfig{Source: src}, "PublisherConfig.Targets is empty"},
		{"negative resync", PublisherConfig{Source: src, Targets: []Target{ok}, Resync: -time.Second}, "PublisherConfig.Resync must not be negative"},
		{"bad target", PublisherConfig{Source: src, Targets: []Target{ok, {Kind: APIService}}}, "PublisherConfig.Targets[1]: neither Name nor Selector"},
		{"selects everything", PublisherConfig{Source: src, Targets: []Target{{Kind: MutatingWebhookConfiguration, Selector: labels.Everything()}}},
			"PublisherConfig.Targets[0].Selector \"\" matches every MutatingWebhookConfiguration of the cluster"},
		{"no client", PublisherConfig{Source: src, Targets: []Target{ok}}, "neither PublisherConfig.AggregatorClient nor PublisherConfig.KubeConfig is set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPublisher(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want one mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestRunTwiceFailsAndNoGoroutineOutlivesRun(t *testing.T) {
	f := fakeClients{
		kube: kubefake.NewClientset(), ext: apiextensionsfake.NewClientset(), agg: aggregatorfake.NewClientset(),
	}
	p, err := NewPublisher(f.config(newTestCA([]byte("x")), false,
		Target{Kind: ValidatingWebhookConfiguration, Name: "a"},
		Target{Kind: MutatingWebhookConfiguration, Selector: labels.SelectorFromSet(labels.Set{"app": "b"})},
		Target{Kind: CustomResourceDefinition, Name: "c.example.com"},
		Target{Kind: APIService, Selector: labels.SelectorFromSet(labels.Set{"app": "d"})},
	))
	if err != nil {
		t.Fatal(err)
	}
	stop := runPublisher(t, p)
	time.Sleep(200 * time.Millisecond)
	// A second Run returns at once (this would block forever otherwise)
	// and logs why.
	p.Run(context.Background(), 0)
	stop()
	// Run waited for its own goroutines; informer internals it started
	// must be gone too.
	for _, frame := range []string{"cabundle.(*Publisher)", "cache.(*sharedIndexInformer).RunWithContext", "cache.(*processorListener)"} {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if strings.Contains(stacks, frame) {
			t.Errorf("goroutine running %s after Run returned:\n%s", frame, stacks)
		}
	}
}

// waitSynced polls p.HasSynced for up to timeout and returns its last value.
func waitSynced(p *Publisher, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !p.HasSynced() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
