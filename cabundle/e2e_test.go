//go:build e2e

package cabundle

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	"github.com/evercert/evercert/internal/testcluster"
)

const (
	e2eGroup        = "e2e.evercert.test"
	noPatchUser     = "evercert-nopatch"
	minimalUser     = "evercert-minimal"
	publishDeadline = 2 * time.Second  // bundle change -> every object
	repairDeadline  = 5 * time.Second  // hand-made overwrite -> repaired
	appearDeadline  = 10 * time.Second // object created -> published
)

// e2eEnv is a running cluster with admin clients.
type e2eEnv struct {
	c    *testcluster.Cluster
	kube kubernetes.Interface
	ext  apiextensionsclient.Interface
	agg  aggregatorclient.Interface
}

func newE2EEnv(t *testing.T, opts ...testcluster.Option) *e2eEnv {
	t.Helper()
	opts = append(opts, testcluster.WithUsers(testcluster.User{Name: noPatchUser}, testcluster.User{Name: minimalUser}))
	c := testcluster.Start(t, opts...)
	cfg := c.Config()
	return &e2eEnv{
		c:    c,
		kube: kubernetes.NewForConfigOrDie(cfg),
		ext:  apiextensionsclient.NewForConfigOrDie(cfg),
		agg:  aggregatorclient.NewForConfigOrDie(cfg),
	}
}

// webhookClientConfigs returns the client configs of the test webhooks, by
// webhook name.
func webhookClientConfigs() map[string]admissionregistrationv1.WebhookClientConfig {
	url := "https://127.0.0.1:1/x"
	path := "/x"
	return map[string]admissionregistrationv1.WebhookClientConfig{
		"svc1.evercert.test":  {Service: &admissionregistrationv1.ServiceReference{Namespace: "ns1", Name: "svc1", Path: &path}},
		"other.evercert.test": {Service: &admissionregistrationv1.ServiceReference{Namespace: "ns1", Name: "other", Path: &path}},
		"url.evercert.test":   {URL: &url},
	}
}

var webhookOrder = []string{"svc1.evercert.test", "other.evercert.test", "url.evercert.test"}

// harmlessRules match only a made-up resource, so the webhooks (which also
// fail open) never affect anything.
func harmlessRules() []admissionregistrationv1.RuleWithOperations {
	return []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{"nothing.evercert.test"}, APIVersions: []string{"v1"}, Resources: []string{"nothings"},
		},
	}}
}

func validatingFixture(name string, lbls map[string]string, otherBundle []byte) *admissionregistrationv1.ValidatingWebhookConfiguration {
	ignore := admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(3)
	o := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
	for _, wh := range webhookOrder {
		cc := webhookClientConfigs()[wh]
		if wh == "other.evercert.test" {
			cc.CABundle = otherBundle
		}
		o.Webhooks = append(o.Webhooks, admissionregistrationv1.ValidatingWebhook{
			Name: wh, ClientConfig: cc, Rules: harmlessRules(), FailurePolicy: &ignore, SideEffects: &none,
			AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: &timeout,
		})
	}
	return o
}

func mutatingFixture(name string) *admissionregistrationv1.MutatingWebhookConfiguration {
	ignore := admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	o := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, wh := range []string{"url.evercert.test", "svc1.evercert.test"} {
		o.Webhooks = append(o.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name: wh, ClientConfig: webhookClientConfigs()[wh], Rules: harmlessRules(), FailurePolicy: &ignore,
			SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
		})
	}
	return o
}

func crdE2EFixture(plural string) *apiextensionsv1.CustomResourceDefinition {
	url := "https://127.0.0.1:1/convert"
	preserve := true
	schema := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type: "object", XPreserveUnknownFields: &preserve,
	}}
	kind := strings.ToUpper(plural[:1]) + strings.TrimSuffix(plural[1:], "s")
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + e2eGroup, Labels: map[string]string{"keep": "me"}},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: e2eGroup,
			Scope: apiextensionsv1.ClusterScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: plural, Singular: strings.TrimSuffix(plural, "s"), Kind: kind, ListKind: kind + "List",
			},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1", Served: true, Storage: true, Schema: schema},
				{Name: "v2", Served: true, Storage: false, Schema: schema},
			},
			Conversion: &apiextensionsv1.CustomResourceConversion{
				Strategy: apiextensionsv1.WebhookConverter,
				Webhook: &apiextensionsv1.WebhookConversion{
					ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: &url},
					ConversionReviewVersions: []string{"v1"},
				},
			},
		},
	}
}

func apiServiceE2EFixture(version, group string) *apiregistrationv1.APIService {
	port := int32(443)
	return &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: version + "." + group},
		Spec: apiregistrationv1.APIServiceSpec{
			Service:               &apiregistrationv1.ServiceReference{Namespace: "ns1", Name: "api", Port: &port},
			Group:                 group,
			Version:               version,
			InsecureSkipTLSVerify: false,
			GroupPriorityMinimum:  1000,
			VersionPriority:       15,
		},
	}
}

// startPublisher runs a publisher until the test ends (or stop is called).
func startPublisher(t *testing.T, cfg PublisherConfig) (*Publisher, func()) {
	t.Helper()
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, runPublisher(t, p)
}

// waitUntil polls cond every 50 ms until it is true, and returns how long
// that took; it fails the test after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, timeout, what, cond)
	d := time.Since(start)
	t.Logf("%s after %v", what, d.Round(time.Millisecond))
	return d
}

// bundleReader reads every caBundle a test looks at, by a short name.
type bundleReader struct {
	t   *testing.T
	env *e2eEnv
}

func (r bundleReader) vwc(name, webhook string) []byte {
	o, err := r.env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatalf("get ValidatingWebhookConfiguration %s: %v", name, err)
	}
	for _, wh := range o.Webhooks {
		if wh.Name == webhook {
			return wh.ClientConfig.CABundle
		}
	}
	r.t.Fatalf("ValidatingWebhookConfiguration %s has no webhook %s", name, webhook)
	return nil
}

func (r bundleReader) mwc(name, webhook string) []byte {
	o, err := r.env.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatalf("get MutatingWebhookConfiguration %s: %v", name, err)
	}
	for _, wh := range o.Webhooks {
		if wh.Name == webhook {
			return wh.ClientConfig.CABundle
		}
	}
	r.t.Fatalf("MutatingWebhookConfiguration %s has no webhook %s", name, webhook)
	return nil
}

func (r bundleReader) crd(name string) []byte {
	o, err := r.env.ext.ApiextensionsV1().CustomResourceDefinitions().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatalf("get CRD %s: %v", name, err)
	}
	return o.Spec.Conversion.Webhook.ClientConfig.CABundle
}

func (r bundleReader) apiService(name string) []byte {
	o, err := r.env.agg.ApiregistrationV1().APIServices().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatalf("get APIService %s: %v", name, err)
	}
	return o.Spec.CABundle
}

// TestE2EPublisher runs every scenario against one real kube-apiserver;
// the subtests build on each other and run in order.
func TestE2EPublisher(t *testing.T) {
	env := newE2EEnv(t)
	ctx := context.Background()
	rd := bundleReader{t, env}

	const (
		vwcName = "evercert-e2e-vwc"
		mwcName = "evercert-e2e-mwc"
	)
	crdName := "widgets." + e2eGroup
	apiName := "v1alpha1." + e2eGroup
	otherBundle := newBundle(t, "someone-else")
	bundle1 := newBundle(t, "ca-1")
	source := newTestCA(bundle1)
	selectorLabels := map[string]string{"evercert.test/inject": "json"}

	kinds := []Kind{ValidatingWebhookConfiguration, MutatingWebhookConfiguration, CustomResourceDefinition, APIService}
	before := map[Kind]map[string]float64{}
	for _, k := range kinds {
		before[k] = publishCounts(t, k)
	}

	p, stop := startPublisher(t, PublisherConfig{
		Source:     source,
		KubeConfig: env.c.Config(),
		Resync:     10 * time.Second,
		Targets: []Target{
			{Kind: ValidatingWebhookConfiguration, Name: vwcName, Service: &ServiceRef{Namespace: "ns1", Name: "svc1"}},
			{Kind: MutatingWebhookConfiguration, Name: mwcName},
			{Kind: CustomResourceDefinition, Name: crdName},
			{Kind: APIService, Name: apiName},
			{Kind: ValidatingWebhookConfiguration, Selector: labels.SelectorFromSet(selectorLabels)},
		},
	})

	t.Run("waits for missing objects, publishes when they appear", func(t *testing.T) {
		if waitSynced(p, time.Second) {
			t.Fatal("HasSynced true before the objects exist")
		}
		if _, err := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, validatingFixture(vwcName, nil, otherBundle), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mutatingFixture(mwcName), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crdE2EFixture("widgets"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.agg.ApiregistrationV1().APIServices().Create(ctx, apiServiceE2EFixture("v1alpha1", e2eGroup), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitReady(t, p, appearDeadline)
		t.Logf("Ready after %v", time.Since(start).Round(time.Millisecond))

		// Service filter: only the webhook of ns1/svc1 got the bundle; the
		// other service's webhook keeps its own, the URL webhook none.
		if got := rd.vwc(vwcName, "svc1.evercert.test"); !bytes.Equal(got, bundle1) {
			t.Errorf("svc1 webhook: caBundle not published")
		}
		if got := rd.vwc(vwcName, "other.evercert.test"); !bytes.Equal(got, otherBundle) {
			t.Errorf("other-service webhook: caBundle changed")
		}
		if got := rd.vwc(vwcName, "url.evercert.test"); len(got) != 0 {
			t.Errorf("URL webhook: caBundle written, but the target is restricted to ns1/svc1")
		}
		// No filter: every webhook.
		for _, wh := range []string{"url.evercert.test", "svc1.evercert.test"} {
			if !bytes.Equal(rd.mwc(mwcName, wh), bundle1) {
				t.Errorf("mutating webhook %s: caBundle not published", wh)
			}
		}
		if !bytes.Equal(rd.crd(crdName), bundle1) {
			t.Error("CRD conversion webhook: caBundle not published")
		}
		if !bytes.Equal(rd.apiService(apiName), bundle1) {
			t.Error("APIService: caBundle not published")
		}
		for _, k := range kinds {
			if d := countsDelta(before[k], publishCounts(t, k)); d[resultSuccess] < 1 || d[resultError] != 0 {
				t.Errorf("%s: metrics delta %v, want successes and no error", k, d)
			}
		}
	})

	t.Run("bundle change is republished within 2s", func(t *testing.T) {
		bundle2 := newBundle(t, "ca-2")
		source.set(bundle2)
		d := waitUntil(t, publishDeadline, "new bundle in all four kinds", func() bool {
			return bytes.Equal(rd.vwc(vwcName, "svc1.evercert.test"), bundle2) &&
				bytes.Equal(rd.mwc(mwcName, "url.evercert.test"), bundle2) &&
				bytes.Equal(rd.mwc(mwcName, "svc1.evercert.test"), bundle2) &&
				bytes.Equal(rd.crd(crdName), bundle2) &&
				bytes.Equal(rd.apiService(apiName), bundle2)
		})
		if d > publishDeadline {
			t.Errorf("republished after %v, want < %v", d, publishDeadline)
		}
		if !bytes.Equal(rd.vwc(vwcName, "other.evercert.test"), otherBundle) {
			t.Error("other-service webhook changed on bundle change")
		}
	})

	t.Run("unchanged objects are not written", func(t *testing.T) {
		rv := func() string {
			o, err := env.agg.ApiregistrationV1().APIServices().Get(ctx, apiName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return o.ResourceVersion
		}
		rvBefore := rv()
		b := publishCounts(t, APIService)
		// Same content again: a notification without a change.
		source.set(source.CurrentCABundleContent())
		waitUntil(t, 5*time.Second, "unchanged counted", func() bool {
			return countsDelta(b, publishCounts(t, APIService))[resultUnchanged] >= 1
		})
		if d := countsDelta(b, publishCounts(t, APIService)); d[resultSuccess] != 0 {
			t.Errorf("metrics delta %v: an up-to-date APIService was written", d)
		}
		if rvBefore != rv() {
			t.Error("APIService resourceVersion changed although it already held the bundle")
		}
	})

	t.Run("hand-made overwrites are repaired", func(t *testing.T) {
		want := source.CurrentCABundleContent()
		overwrite := func(what string, update func() error) {
			t.Helper()
			if err := retry.RetryOnConflict(retry.DefaultRetry, update); err != nil {
				t.Fatalf("overwrite %s: %v", what, err)
			}
		}
		overwrite("vwc", func() error {
			o, err := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwcName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			o.Webhooks[0].ClientConfig.CABundle = otherBundle
			_, err = env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, o, metav1.UpdateOptions{})
			return err
		})
		overwrite("mwc", func() error {
			o, err := env.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, mwcName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			o.Webhooks[1].ClientConfig.CABundle = nil // removed altogether
			_, err = env.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, o, metav1.UpdateOptions{})
			return err
		})
		overwrite("crd", func() error {
			o, err := env.ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crdName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			o.Spec.Conversion.Webhook.ClientConfig.CABundle = otherBundle
			_, err = env.ext.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, o, metav1.UpdateOptions{})
			return err
		})
		overwrite("apiservice", func() error {
			o, err := env.agg.ApiregistrationV1().APIServices().Get(ctx, apiName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			o.Spec.CABundle = otherBundle
			_, err = env.agg.ApiregistrationV1().APIServices().Update(ctx, o, metav1.UpdateOptions{})
			return err
		})
		waitUntil(t, repairDeadline, "all overwrites repaired", func() bool {
			return bytes.Equal(rd.vwc(vwcName, "svc1.evercert.test"), want) &&
				bytes.Equal(rd.mwc(mwcName, "svc1.evercert.test"), want) &&
				bytes.Equal(rd.crd(crdName), want) &&
				bytes.Equal(rd.apiService(apiName), want)
		})
		// A one-off change is drift, not a contest.
		if got := p.Contested(); len(got) != 0 {
			t.Errorf("contested after one-off overwrites: %v", got)
		}
	})

	t.Run("selector target picks up a new matching object", func(t *testing.T) {
		// Not matching: left alone.
		if _, err := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx,
			validatingFixture("evercert-e2e-unlabelled", map[string]string{"evercert.test/inject": "no"}, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx,
			validatingFixture("evercert-e2e-labelled", selectorLabels, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want := source.CurrentCABundleContent()
		waitUntil(t, appearDeadline, "labelled object published", func() bool {
			for _, wh := range webhookOrder {
				if !bytes.Equal(rd.vwc("evercert-e2e-labelled", wh), want) {
					return false
				}
			}
			return true
		})
		for _, wh := range webhookOrder {
			if len(rd.vwc("evercert-e2e-unlabelled", wh)) != 0 {
				t.Errorf("object not matching the selector was written (webhook %s)", wh)
			}
		}
	})

	t.Run("stale resourceVersion is a conflict", func(t *testing.T) {
		// The JSON patch of a webhook configuration addresses webhooks by
		// index, so it carries the resourceVersion it was computed on; the
		// server must refuse it once the object moved on.
		o, err := env.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, mwcName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a := mutatingWebhookAdapter(env.kube)
		stale, _ := a.view(o)
		pub := &Publisher{fieldManager: "evercert-e2e-conflict"}
		opts := metav1.PatchOptions{FieldManager: "evercert-e2e-conflict"}
		pt, data, _ := pub.buildWrite(a, stale, stale.slots, newBundle(t, "conflict-1"))
		if err := a.patch(ctx, mwcName, pt, data, opts); err != nil {
			t.Fatalf("first patch: %v", err)
		}
		pt, data, _ = pub.buildWrite(a, stale, stale.slots, newBundle(t, "conflict-2"))
		if err := a.patch(ctx, mwcName, pt, data, opts); !apierrors.IsConflict(err) {
			t.Fatalf("patch with stale resourceVersion: %v, want a 409 conflict", err)
		}
		// And the running publisher repairs what this subtest wrote.
		want := source.CurrentCABundleContent()
		waitUntil(t, repairDeadline, "MutatingWebhookConfiguration repaired", func() bool {
			return bytes.Equal(rd.mwc(mwcName, "url.evercert.test"), want) && bytes.Equal(rd.mwc(mwcName, "svc1.evercert.test"), want)
		})
	})

	t.Run("metrics", func(t *testing.T) {
		for _, k := range kinds {
			d := countsDelta(before[k], publishCounts(t, k))
			t.Logf("%s: %v", k, d)
			if d[resultSuccess] < 2 || d[resultError] != 0 {
				t.Errorf("%s: metrics delta %v, want >= 2 successes and no error", k, d)
			}
		}
	})

	stop()

	t.Run("server-side apply does not clobber other fields", func(t *testing.T) {
		testE2EServerSideApply(t, env)
	})
	t.Run("missing patch permission", func(t *testing.T) {
		testE2ENoPatchPermission(t, env, vwcName)
	})
	t.Run("minimal RBAC with resourceNames", func(t *testing.T) {
		testE2EMinimalRBAC(t, env, mwcName)
	})
}

func testE2EServerSideApply(t *testing.T, env *e2eEnv) {
	ctx := context.Background()
	rd := bundleReader{t, env}
	const vwcName = "evercert-e2e-ssa"
	crdName := "gadgets." + e2eGroup
	apiName := "v1beta1." + e2eGroup
	otherBundle := newBundle(t, "someone-else")

	vwc := validatingFixture(vwcName, map[string]string{"keep": "me"}, otherBundle)
	vwc.Annotations = map[string]string{"keep": "me too"}
	if _, err := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crdE2EFixture("gadgets"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.agg.ApiregistrationV1().APIServices().Create(ctx, apiServiceE2EFixture("v1beta1", e2eGroup), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := map[Kind]map[string]float64{}
	for _, k := range []Kind{ValidatingWebhookConfiguration, CustomResourceDefinition, APIService} {
		before[k] = publishCounts(t, k)
	}

	bundle := newBundle(t, "ssa-1")
	source := newTestCA(bundle)
	p, _ := startPublisher(t, PublisherConfig{
		Source:             source,
		KubeConfig:         env.c.Config(),
		UseServerSideApply: true,
		Targets: []Target{
			{Kind: ValidatingWebhookConfiguration, Name: vwcName, Service: &ServiceRef{Namespace: "ns1", Name: "svc1"}},
			{Kind: CustomResourceDefinition, Name: crdName},
			{Kind: APIService, Name: apiName},
		},
	})
	waitReady(t, p, appearDeadline)

	check := func(want []byte) {
		t.Helper()
		o, err := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwcName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if o.Labels["keep"] != "me" || o.Annotations["keep"] != "me too" {
			t.Errorf("labels/annotations clobbered: %v %v", o.Labels, o.Annotations)
		}
		if len(o.Webhooks) != 3 {
			t.Fatalf("webhooks: %d, want 3", len(o.Webhooks))
		}
		for i, wh := range o.Webhooks {
			if wh.Name != webhookOrder[i] || len(wh.Rules) != 1 || wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Ignore ||
				wh.SideEffects == nil || wh.TimeoutSeconds == nil || len(wh.AdmissionReviewVersions) != 1 {
				t.Errorf("webhook %d clobbered: %+v", i, wh)
			}
		}
		if !bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, want) {
			t.Error("svc1 webhook: bundle not applied")
		}
		if s := o.Webhooks[0].ClientConfig.Service; s == nil || s.Name != "svc1" || s.Path == nil {
			t.Errorf("svc1 webhook: service clobbered: %+v", s)
		}
		if !bytes.Equal(o.Webhooks[1].ClientConfig.CABundle, otherBundle) || o.Webhooks[1].ClientConfig.Service == nil {
			t.Error("other-service webhook clobbered")
		}
		if o.Webhooks[2].ClientConfig.URL == nil || len(o.Webhooks[2].ClientConfig.CABundle) != 0 {
			t.Error("URL webhook clobbered")
		}
		// The evercert apply entry owns caBundle and the key, nothing else.
		for _, mf := range o.ManagedFields {
			if mf.Manager != DefaultFieldManager {
				continue
			}
			if mf.Operation != metav1.ManagedFieldsOperationApply {
				t.Errorf("evercert managed-fields entry has operation %s", mf.Operation)
			}
			owned := string(mf.FieldsV1.GetRawBytes())
			for _, bad := range []string{"f:rules", "f:url", "f:service", "f:failurePolicy", "f:labels", `"other.evercert.test"`} {
				if strings.Contains(owned, bad) {
					t.Errorf("evercert owns %s: %s", bad, owned)
				}
			}
			if !strings.Contains(owned, "f:caBundle") {
				t.Errorf("evercert does not own caBundle: %s", owned)
			}
		}

		crd, err := env.ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crdName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conv := crd.Spec.Conversion
		if conv.Strategy != apiextensionsv1.WebhookConverter || conv.Webhook.ClientConfig.URL == nil ||
			len(conv.Webhook.ConversionReviewVersions) != 1 || len(crd.Spec.Versions) != 2 || crd.Labels["keep"] != "me" {
			t.Errorf("CRD clobbered: %+v", crd.Spec)
		}
		if !bytes.Equal(conv.Webhook.ClientConfig.CABundle, want) {
			t.Error("CRD: bundle not applied")
		}
		api, err := env.agg.ApiregistrationV1().APIServices().Get(ctx, apiName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if api.Spec.Service == nil || api.Spec.Service.Name != "api" || api.Spec.GroupPriorityMinimum != 1000 || api.Spec.VersionPriority != 15 {
			t.Errorf("APIService clobbered: %+v", api.Spec)
		}
		if !bytes.Equal(api.Spec.CABundle, want) {
			t.Error("APIService: bundle not applied")
		}
	}
	check(bundle)

	// Another manager changes an unrelated field; the next apply keeps it.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		o, err := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwcName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		five := int32(5)
		o.Webhooks[0].TimeoutSeconds = &five
		_, err = env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, o, metav1.UpdateOptions{FieldManager: "someone-else"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	bundle2 := newBundle(t, "ssa-2")
	source.set(bundle2)
	waitUntil(t, publishDeadline, "SSA republished", func() bool {
		return bytes.Equal(rd.vwc(vwcName, "svc1.evercert.test"), bundle2) && bytes.Equal(rd.crd(crdName), bundle2) &&
			bytes.Equal(rd.apiService(apiName), bundle2)
	})
	check(bundle2)
	o, _ := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwcName, metav1.GetOptions{})
	if ts := o.Webhooks[0].TimeoutSeconds; ts == nil || *ts != 5 {
		t.Errorf("timeoutSeconds set by another manager was reverted: %v", ts)
	}

	// Drift: another manager takes caBundle over with an update. Under
	// server-side apply that is a conflict: reported as contested, not
	// forced at once; the forced apply takes it back after the backoff.
	beforeDrift := publishCounts(t, ValidatingWebhookConfiguration)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		o, err := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwcName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		o.Webhooks[0].ClientConfig.CABundle = otherBundle
		_, err = env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, o, metav1.UpdateOptions{FieldManager: "someone-else"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, repairDeadline, "SSA conflict reported as contested", func() bool {
		return countsDelta(beforeDrift, publishCounts(t, ValidatingWebhookConfiguration))[resultContested] >= 1
	})
	if got := p.Contested(); !slices.Equal(got, []string{objectKey(ValidatingWebhookConfiguration, vwcName)}) {
		t.Errorf("Contested() = %v after a conflict", got)
	}
	waitUntil(t, contestInitialDelay*3/2+repairDeadline, "SSA drift repaired with force after the backoff", func() bool {
		return bytes.Equal(rd.vwc(vwcName, "svc1.evercert.test"), bundle2)
	})
	check(bundle2)

	for k, b := range before {
		if d := countsDelta(b, publishCounts(t, k)); d[resultSuccess] < 2 || d[resultError] != 0 {
			t.Errorf("%s: metrics delta %v, want >= 2 successes, no error", k, d)
		}
	}
}

// grant creates a ClusterRole with rule and binds it to user.
func grant(t *testing.T, env *e2eEnv, user string, rule rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	name := "evercert-e2e-" + user
	if _, err := env.kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func testE2ENoPatchPermission(t *testing.T, env *e2eEnv, vwcName string) {
	rd := bundleReader{t, env}
	grant(t, env, noPatchUser, rbacv1.PolicyRule{
		APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingwebhookconfigurations"},
		Verbs: []string{"get", "list", "watch"},
	})
	prev := rd.vwc(vwcName, "svc1.evercert.test")
	before := publishCounts(t, ValidatingWebhookConfiguration)
	p, _ := startPublisher(t, PublisherConfig{
		Source:     newTestCA(newBundle(t, "forbidden")),
		KubeConfig: env.c.UserConfig(noPatchUser),
		Targets:    []Target{{Kind: ValidatingWebhookConfiguration, Name: vwcName}},
	})
	waitUntil(t, appearDeadline, "error counted", func() bool {
		return countsDelta(before, publishCounts(t, ValidatingWebhookConfiguration))[resultError] >= 2
	})
	if waitSynced(p, 2*time.Second) {
		t.Error("HasSynced true although every write is forbidden")
	}
	if d := countsDelta(before, publishCounts(t, ValidatingWebhookConfiguration)); d[resultSuccess] != 0 {
		t.Errorf("metrics delta %v: success without patch permission", d)
	}
	if !bytes.Equal(rd.vwc(vwcName, "svc1.evercert.test"), prev) {
		t.Error("object changed without patch permission")
	}
}

func testE2EMinimalRBAC(t *testing.T, env *e2eEnv, mwcName string) {
	// Exactly what the package documentation promises is enough for a
	// named target: list, watch and patch, narrowed to the one name.
	grant(t, env, minimalUser, rbacv1.PolicyRule{
		APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"},
		Verbs: []string{"list", "watch", "patch"}, ResourceNames: []string{mwcName},
	})
	for _, ssa := range []bool{false, true} {
		bundle := newBundle(t, "minimal")
		p, stop := startPublisher(t, PublisherConfig{
			Source:             newTestCA(bundle),
			KubeConfig:         env.c.UserConfig(minimalUser),
			UseServerSideApply: ssa,
			Targets:            []Target{{Kind: MutatingWebhookConfiguration, Name: mwcName}},
		})
		waitReady(t, p, appearDeadline)
		if !bytes.Equal(bundleReader{t, env}.mwc(mwcName, "svc1.evercert.test"), bundle) {
			t.Errorf("ssa=%v: not published with minimal RBAC", ssa)
		}
		stop()
	}
}

// TestE2EAPIServerDown checks that writes which fail while the API server
// is down are retried, and succeed once it is back. It has a cluster of its
// own because stopping the API server disturbs everything else running.
func TestE2EAPIServerDown(t *testing.T) {
	// The publisher's informer holds a watch open. By default
	// kube-apiserver's graceful shutdown lets open watches run until its
	// 60s shutdown timeout, longer than testcluster waits before SIGKILL
	// (a failure); with a watch termination grace period it ends them.
	env := newE2EEnv(t, testcluster.WithAPIServerFlags("--shutdown-watch-termination-grace-period=2s"))
	rd := bundleReader{t, env}
	const name = "evercert-e2e-restart"
	if _, err := env.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(),
		mutatingFixture(name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	source := newTestCA(newBundle(t, "before-restart"))
	before := publishCounts(t, MutatingWebhookConfiguration)
	p, _ := startPublisher(t, PublisherConfig{
		Source:     source,
		KubeConfig: env.c.Config(),
		Targets:    []Target{{Kind: MutatingWebhookConfiguration, Name: name}},
	})
	waitReady(t, p, appearDeadline)

	env.c.StopAPIServer(t)
	bundle := newBundle(t, "after-restart")
	source.set(bundle)
	waitUntil(t, 10*time.Second, "errors counted while the API server is down", func() bool {
		return countsDelta(before, publishCounts(t, MutatingWebhookConfiguration))[resultError] >= 2
	})
	env.c.StartAPIServer(t)
	// The informer's relist after the watch broke queues the target at
	// once, without waiting for the backoff.
	waitUntil(t, 30*time.Second, "published after the API server came back", func() bool {
		return bytes.Equal(rd.mwc(name, "svc1.evercert.test"), bundle)
	})
}

// TestE2ECompetingWriter runs a publisher next to another writer of the same
// caBundle (as Helm, cainjector or OLM would be) on a real kube-apiserver:
// for about 10s the other writer puts its own bundle back every time it
// changes, then it goes away. The publisher must write a bounded number of
// times (its contested backoff, not once per flip), report the object as
// contested (metric, health check, an Event in the cluster), and converge
// once the other writer is gone.
func TestE2ECompetingWriter(t *testing.T) {
	env := newE2EEnv(t)
	ctx := context.Background()
	rd := bundleReader{t, env}
	const (
		name  = "evercert-e2e-contested"
		fight = 10 * time.Second
	)
	key := objectKey(MutatingWebhookConfiguration, name)
	ours, theirs := newBundle(t, "ours"), newBundle(t, "theirs")
	if _, err := env.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mutatingFixture(name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: env.kube.EventsV1()})
	eventsCtx, stopEvents := context.WithCancel(ctx)
	if err := broadcaster.StartRecordingToSinkWithContext(eventsCtx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopEvents(); broadcaster.Shutdown() })
	p, _ := startPublisher(t, PublisherConfig{
		Source:        newTestCA(ours),
		KubeConfig:    env.c.Config(),
		Targets:       []Target{{Kind: MutatingWebhookConfiguration, Name: name}},
		EventRecorder: broadcaster.NewRecorder(scheme.Scheme, "evercert-e2e"),
	})
	waitReady(t, p, appearDeadline)
	before := publishCounts(t, MutatingWebhookConfiguration)

	start := time.Now()
	other := startCompetitor(t, env.kube, name, theirs, "competitor")
	waitUntil(t, fight, "contested", func() bool { return slices.Equal(p.Contested(), []string{key}) })
	if err := p.HealthCheck().Check(nil); err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "competitor") {
		t.Errorf("health check while contested: %v, want a failure naming %s and the competitor", err, key)
	}
	// The scenario's length, not an assertion.
	time.Sleep(time.Until(start.Add(fight)))
	other.stop()
	stopped := time.Now()
	d := countsDelta(before, publishCounts(t, MutatingWebhookConfiguration))
	bound := contestReverts + 2 + maxContestedWrites(stopped.Sub(start))
	t.Logf("next to a competing writer for %v: %d writes by the publisher (bound %d), %d by the other writer; publish results %v",
		stopped.Sub(start).Round(time.Millisecond), int(d[resultSuccess]), bound, other.rewrites.Load(), d)
	if int(d[resultSuccess]) > bound {
		t.Errorf("%v writes next to a competing writer, want <= %d", d[resultSuccess], bound)
	}
	if d[resultContested] < 1 {
		t.Errorf("metrics delta %v, want result=contested", d)
	}

	// The other writer is gone: the publisher's next write sticks and the
	// contest clears (next delay, then contestQuiet or that delay).
	waitUntil(t, 2*time.Minute, "converged after the competing writer stopped", func() bool {
		return bytes.Equal(rd.mwc(name, "svc1.evercert.test"), ours) && bytes.Equal(rd.mwc(name, "url.evercert.test"), ours) &&
			len(p.Contested()) == 0 && p.HealthCheck().Check(nil) == nil
	})
	if !p.Observed(parseCA(t, ours)) {
		t.Error("not observed after converging")
	}

	// The Events reached the cluster, on the object.
	waitUntil(t, 10*time.Second, "Events in the cluster", func() bool {
		list, err := env.kube.EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, e := range list.Items {
			if e.Regarding.Kind == string(MutatingWebhookConfiguration) && e.Regarding.Name == name {
				seen[e.Reason] = true
				if e.Reason == reasonContested && !strings.Contains(e.Note, "competitor") {
					t.Errorf("contested Event does not name the other writer: %q", e.Note)
				}
			}
		}
		return seen[reasonContested] && seen[reasonUncontested]
	})
}
