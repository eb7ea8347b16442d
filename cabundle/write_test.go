package cabundle

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// vwcFixture has four webhooks: two for service ns1/svc1 (one of them
// already holding newBundle), one for another service, one for a URL.
func vwcFixture(current, svc1Bundle []byte) *admissionregistrationv1.ValidatingWebhookConfiguration {
	url := "https://127.0.0.1:1/x"
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "vwc", ResourceVersion: "42", Labels: map[string]string{"app": "x"}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "a.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "ns1", Name: "svc1"}, CABundle: current}},
			{Name: "b.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "ns1", Name: "other"}, CABundle: current}},
			{Name: "c.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url}},
			{Name: "d.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "ns1", Name: "svc1"}, CABundle: svc1Bundle}},
		},
	}
}

// publisherFor returns a Publisher (not running) with the given targets and
// no clients; enough for the pure functions.
func publisherFor(t *testing.T, ssa bool, targets ...Target) *Publisher {
	t.Helper()
	p := &Publisher{ssa: ssa, fieldManager: DefaultFieldManager}
	for _, tg := range targets {
		if err := tg.validate("target"); err != nil {
			t.Fatalf("target %s: %v", tg, err)
		}
		p.targets = append(p.targets, &targetState{Target: tg})
	}
	return p
}

func decodeOps(t *testing.T, data []byte) []jsonPatchOp {
	t.Helper()
	var ops []jsonPatchOp
	if err := json.Unmarshal(data, &ops); err != nil {
		t.Fatalf("decode JSON patch %s: %v", data, err)
	}
	return ops
}

func TestJSONPatchTouchesOnlySelectedStaleCABundles(t *testing.T) {
	old, bundle := []byte("old"), []byte("new bundle")
	a := adapterOf(t, ValidatingWebhookConfiguration)
	v, ok := a.view(vwcFixture(old, bundle))
	if !ok {
		t.Fatal("view rejected a ValidatingWebhookConfiguration")
	}

	for _, tc := range []struct {
		name      string
		service   *ServiceRef
		wantPaths []string
	}{
		{"service filter", &ServiceRef{Namespace: "ns1", Name: "svc1"},
			// d already holds the bundle; b and c refer elsewhere.
			[]string{"/webhooks/0/clientConfig/caBundle"}},
		{"all webhooks", nil,
			[]string{"/webhooks/0/clientConfig/caBundle", "/webhooks/1/clientConfig/caBundle", "/webhooks/2/clientConfig/caBundle"}},
		{"service of nobody", &ServiceRef{Namespace: "ns2", Name: "svc1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := publisherFor(t, false, Target{Kind: ValidatingWebhookConfiguration, Name: "vwc", Service: tc.service})
			selected := p.selectedSlots(ValidatingWebhookConfiguration, v)
			if tc.wantPaths == nil {
				if len(selected) != 0 {
					t.Fatalf("selected %v, want none", selected)
				}
				return
			}
			pt, data, err := p.buildWrite(a, v, selected, bundle)
			if err != nil {
				t.Fatal(err)
			}
			if pt != types.JSONPatchType {
				t.Fatalf("patch type %s, want JSON patch", pt)
			}
			ops := decodeOps(t, data)
			if len(ops) == 0 || ops[0] != (jsonPatchOp{Op: "replace", Path: "/metadata/resourceVersion", Value: "42"}) {
				t.Fatalf("first op %+v, want the resourceVersion precondition", ops)
			}
			var paths []string
			for _, op := range ops[1:] {
				if op.Op != "add" || !strings.HasSuffix(op.Path, "/clientConfig/caBundle") {
					t.Errorf("op %+v touches something other than a caBundle", op)
				}
				// JSON carries []byte as base64.
				if op.Value != "bmV3IGJ1bmRsZQ==" {
					t.Errorf("op %+v: value is not base64(bundle)", op)
				}
				paths = append(paths, op.Path)
			}
			if !reflect.DeepEqual(paths, tc.wantPaths) {
				t.Errorf("patched %v, want %v", paths, tc.wantPaths)
			}
		})
	}
}

func TestSelectedSlotsUnionAcrossTargets(t *testing.T) {
	a := adapterOf(t, ValidatingWebhookConfiguration)
	v, _ := a.view(vwcFixture(nil, nil))
	p := publisherFor(t, true,
		Target{Kind: ValidatingWebhookConfiguration, Name: "vwc", Service: &ServiceRef{Namespace: "ns1", Name: "svc1"}},
		Target{Kind: ValidatingWebhookConfiguration, Selector: labels.SelectorFromSet(labels.Set{"app": "x"}),
			Service: &ServiceRef{Namespace: "ns1", Name: "other"}},
		// Same service, other kind, other name: must not count.
		Target{Kind: MutatingWebhookConfiguration, Name: "vwc"},
		Target{Kind: ValidatingWebhookConfiguration, Name: "not-vwc"},
	)
	var names []string
	for _, s := range p.selectedSlots(ValidatingWebhookConfiguration, v) {
		names = append(names, s.webhook)
	}
	if want := []string{"a.example.com", "b.example.com", "d.example.com"}; !reflect.DeepEqual(names, want) {
		t.Errorf("selected %v, want %v", names, want)
	}
}

func TestApplyBodiesHoldOnlyOwnedFields(t *testing.T) {
	bundle := []byte("B")
	b64 := "Qg=="
	vwcView, _ := adapterOf(t, ValidatingWebhookConfiguration).view(vwcFixture(nil, nil))
	p := publisherFor(t, true, Target{Kind: ValidatingWebhookConfiguration, Name: "vwc", Service: &ServiceRef{Namespace: "ns1", Name: "svc1"}})

	for _, tc := range []struct {
		name string
		a    *kindAdapter
		v    objectView
		want string
	}{
		{"validating", adapterOf(t, ValidatingWebhookConfiguration), vwcView,
			`{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration","metadata":{"name":"vwc"},
			  "webhooks":[{"name":"a.example.com","clientConfig":{"caBundle":"` + b64 + `"}},{"name":"d.example.com","clientConfig":{"caBundle":"` + b64 + `"}}]}`},
		{"mutating", adapterOf(t, MutatingWebhookConfiguration), objectView{name: "m", slots: []slot{{webhook: "w"}}},
			`{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingWebhookConfiguration","metadata":{"name":"m"},
			  "webhooks":[{"name":"w","clientConfig":{"caBundle":"` + b64 + `"}}]}`},
		{"crd", adapterOf(t, CustomResourceDefinition), objectView{name: "foos.example.com", slots: []slot{{}}},
			`{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"foos.example.com"},
			  "spec":{"conversion":{"webhook":{"clientConfig":{"caBundle":"` + b64 + `"}}}}}`},
		{"apiservice", adapterOf(t, APIService), objectView{name: "v1.example.com", slots: []slot{{}}},
			`{"apiVersion":"apiregistration.k8s.io/v1","kind":"APIService","metadata":{"name":"v1.example.com"},
			  "spec":{"caBundle":"` + b64 + `"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			selected := tc.v.slots
			if tc.name == "validating" {
				selected = p.selectedSlots(ValidatingWebhookConfiguration, tc.v)
			}
			pt, data, err := p.buildWrite(tc.a, tc.v, selected, bundle)
			if err != nil {
				t.Fatal(err)
			}
			if pt != types.ApplyPatchType {
				t.Fatalf("patch type %s, want apply", pt)
			}
			var got, want any
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tc.want), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("apply body\n got %s\nwant %s", data, tc.want)
			}
		})
	}
}

func TestViewsExplainWhyNothingToWrite(t *testing.T) {
	url := "https://127.0.0.1:1/x"
	crd := func(conv *apiextensionsv1.CustomResourceConversion) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "foos.example.com"},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{Conversion: conv}}
	}
	svc := func(ns, name string) *apiregistrationv1.ServiceReference {
		return &apiregistrationv1.ServiceReference{Namespace: ns, Name: name}
	}
	for _, tc := range []struct {
		name      string
		v         objectView
		wantSlots int
		wantNone  string
	}{
		{"crd none", crdView(crd(&apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter})), 0, "strategy"},
		{"crd nil conversion", crdView(crd(nil)), 0, "strategy"},
		{"crd no client config", crdView(crd(&apiextensionsv1.CustomResourceConversion{
			Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{}})), 0, "clientConfig"},
		{"crd webhook", crdView(crd(&apiextensionsv1.CustomResourceConversion{
			Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{
				ClientConfig: &apiextensionsv1.WebhookClientConfig{URL: &url}}})), 1, ""},
		{"local apiservice", apiServiceView(&apiregistrationv1.APIService{}), 0, "local"},
		{"insecure apiservice", apiServiceView(&apiregistrationv1.APIService{Spec: apiregistrationv1.APIServiceSpec{
			Service: svc("ns", "s"), InsecureSkipTLSVerify: true}}), 0, "insecureSkipTLSVerify"},
		{"apiservice", apiServiceView(&apiregistrationv1.APIService{Spec: apiregistrationv1.APIServiceSpec{
			Service: svc("ns", "s")}}), 1, ""},
		{"empty webhook configuration", func() objectView {
			v, _ := adapterOf(t, MutatingWebhookConfiguration).view(&admissionregistrationv1.MutatingWebhookConfiguration{})
			return v
		}(), 0, "no webhooks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.v.slots) != tc.wantSlots {
				t.Errorf("%d slots, want %d", len(tc.v.slots), tc.wantSlots)
			}
			if !strings.Contains(tc.v.none, tc.wantNone) || (tc.wantNone == "") != (tc.v.none == "") {
				t.Errorf("reason %q, want it to mention %q", tc.v.none, tc.wantNone)
			}
		})
	}
	// The APIService slot carries its service, for the Service filter.
	v := apiServiceView(&apiregistrationv1.APIService{Spec: apiregistrationv1.APIServiceSpec{Service: svc("ns", "s")}})
	if got := v.slots[0].service; got == nil || *got != (ServiceRef{Namespace: "ns", Name: "s"}) {
		t.Errorf("APIService slot service %v", got)
	}
}

func TestTargetValidation(t *testing.T) {
	for _, tc := range []struct {
		target  Target
		wantErr string
	}{
		{Target{Kind: APIService, Name: "v1.example.com"}, ""},
		{Target{Kind: APIService, Selector: labels.SelectorFromSet(labels.Set{"app": "x"})}, ""},
		{Target{Name: "x"}, "T.Kind is not set"},
		{Target{Kind: "Secret", Name: "x"}, `T.Kind "Secret" is not supported (supported: [APIService ClusterTrustBundle CustomResourceDefinition MutatingWebhookConfiguration ValidatingWebhookConfiguration])`},
		{Target{Kind: APIService}, "T: neither Name nor Selector is set"},
		{Target{Kind: APIService, Name: "x", Selector: labels.Everything()}, "T: both Name and Selector are set"},
		{Target{Kind: APIService, Name: "Not_A_Name"}, `T.Name "Not_A_Name" is invalid`},
		{Target{Kind: APIService, Selector: labels.Everything()}, `T.Selector "" matches every APIService of the cluster`},
		{Target{Kind: APIService, Selector: labels.NewSelector()}, `T.Selector "" matches every APIService of the cluster`},
		{Target{Kind: APIService, Selector: labels.Nothing()}, "T.Selector matches nothing"},
		{Target{Kind: APIService, Name: "x", Service: &ServiceRef{Name: "s"}}, `T.Service "/s" needs both Namespace and Name`},
	} {
		err := tc.target.validate("T")
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: error %v, want %q", tc.target, err, tc.wantErr)
		}
	}
}

func TestJSONPatchPreconditionOnlyForIndexedPaths(t *testing.T) {
	bundle := []byte("B")
	for _, tc := range []struct {
		name     string
		a        *kindAdapter
		wantPath string
		wantRV   bool
	}{
		{"validating", adapterOf(t, ValidatingWebhookConfiguration), "/webhooks/0/clientConfig/caBundle", true},
		{"mutating", adapterOf(t, MutatingWebhookConfiguration), "/webhooks/0/clientConfig/caBundle", true},
		{"crd", adapterOf(t, CustomResourceDefinition), "/spec/conversion/webhook/clientConfig/caBundle", false},
		{"apiservice", adapterOf(t, APIService), "/spec/caBundle", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := objectView{name: "x", resourceVersion: "9", slots: []slot{{path: tc.wantPath}}}
			p := publisherFor(t, false)
			_, data, err := p.buildWrite(tc.a, v, v.slots, bundle)
			if err != nil {
				t.Fatal(err)
			}
			want := []jsonPatchOp{{Op: "add", Path: tc.wantPath, Value: "Qg=="}}
			if tc.wantRV {
				want = append([]jsonPatchOp{{Op: "replace", Path: "/metadata/resourceVersion", Value: "9"}}, want...)
			}
			if got := decodeOps(t, data); !reflect.DeepEqual(got, want) {
				t.Errorf("patch %+v, want %+v", got, want)
			}
		})
	}
}

func TestInformerTransformsTrimCopies(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "m"}}
	vwc := vwcFixture(nil, nil)
	vwc.ManagedFields = mf
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{ManagedFields: mf}}
	api := &apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{ManagedFields: mf}}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{ManagedFields: mf},
		Spec:       apiextensionsv1.CustomResourceDefinitionSpec{Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1"}}},
		Status:     apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1"}},
	}
	for _, tc := range []struct {
		name string
		a    *kindAdapter
		obj  metav1.Object
	}{
		{"validating", adapterOf(t, ValidatingWebhookConfiguration), vwc},
		{"mutating", adapterOf(t, MutatingWebhookConfiguration), mwc},
		{"crd", adapterOf(t, CustomResourceDefinition), crd},
		{"apiservice", adapterOf(t, APIService), api},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.a.transform(tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			if out == any(tc.obj) {
				t.Fatal("transform returned its input; it must not modify it in place")
			}
			if len(out.(metav1.Object).GetManagedFields()) != 0 {
				t.Error("managedFields kept")
			}
			if len(tc.obj.GetManagedFields()) != 1 {
				t.Error("input modified")
			}
			if _, ok := tc.a.view(out); !ok {
				t.Error("transformed object not viewable")
			}
		})
	}
	if len(crd.Spec.Versions) != 1 || len(crd.Status.StoredVersions) != 1 {
		t.Error("CRD input modified")
	}

	// Who owns a caBundle is kept (to name another writer), without the
	// fields themselves.
	now := metav1.Now()
	owned := vwcFixture(nil, nil)
	owned.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "helm", Operation: metav1.ManagedFieldsOperationUpdate, Time: &now,
			FieldsV1: metav1.NewFieldsV1(`{"f:webhooks":{"k:{\"name\":\"a\"}":{"f:clientConfig":{"f:caBundle":{}}}}}`)},
		{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, Time: &now,
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{}}}`)},
	}
	a := adapterOf(t, ValidatingWebhookConfiguration)
	out, err := a.transform(owned)
	if err != nil {
		t.Fatal(err)
	}
	mf = out.(*admissionregistrationv1.ValidatingWebhookConfiguration).ManagedFields
	if len(mf) != 1 || mf[0].Manager != "helm" || mf[0].FieldsV1 != nil {
		t.Errorf("trimmed managedFields %+v, want helm's entry alone, without fieldsV1", mf)
	}
	v, _ := a.view(out)
	if otherWriter(v, DefaultFieldManager) != "helm" {
		t.Errorf("owners %+v, want helm", v.owners)
	}
	if v, _ := a.view(owned); otherWriter(v, DefaultFieldManager) != "helm" {
		t.Errorf("owners of the untrimmed object %+v, want helm", v.owners)
	}
	if out, _ := trimCRD(crd); len(out.(*apiextensionsv1.CustomResourceDefinition).Spec.Versions) != 0 {
		t.Error("CRD versions kept")
	}
	// Anything else (a tombstone, say) passes through.
	if out, _ := trimCRD("x"); out != "x" {
		t.Error("foreign object not passed through")
	}
}
