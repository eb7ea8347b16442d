package app

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

func configMapJSON(t *testing.T, labels, annotations map[string]string) []byte {
	t.Helper()
	cm := corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "team", Labels: labels, Annotations: annotations},
		Data:       map[string]string{"k": "v"},
	}
	b, err := json.Marshal(cm)
	require.NoError(t, err)
	return b
}

func request(op admissionv1.Operation, obj []byte) *admissionv1.AdmissionRequest {
	return &admissionv1.AdmissionRequest{
		UID:       types.UID("uid-1"),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Name:      "cm",
		Namespace: "team",
		Operation: op,
		Object:    runtime.RawExtension{Raw: obj},
	}
}

func review(req *admissionv1.AdmissionRequest) []byte {
	b, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	return b
}

// post sends body to h and returns the status and the decoded review (if
// the status is 200).
func post(t *testing.T, h http.Handler, contentType string, body []byte) (int, *admissionv1.AdmissionReview, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(body)))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	raw, _ := io.ReadAll(w.Body)
	if w.Code != http.StatusOK {
		return w.Code, nil, string(raw)
	}
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	var out admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(raw, &out))
	return w.Code, &out, string(raw)
}

func TestValidate(t *testing.T) {
	h := AdmissionHandler("validate", Rule{}.Validate)
	for name, tc := range map[string]struct {
		req     *admissionv1.AdmissionRequest
		allowed bool
		code    int32
		msg     string
	}{
		"create with label":       {req: request(admissionv1.Create, configMapJSON(t, map[string]string{"app": "web"}, nil)), allowed: true},
		"create without label":    {req: request(admissionv1.Create, configMapJSON(t, nil, nil)), code: 403, msg: `ConfigMap "cm" in namespace "team" must carry the label "app"`},
		"create with empty label": {req: request(admissionv1.Create, configMapJSON(t, map[string]string{"app": ""}, nil)), code: 403, msg: `must carry the label "app"`},
		"update removing label":   {req: request(admissionv1.Update, configMapJSON(t, map[string]string{"other": "x"}, nil)), code: 403, msg: `must carry the label "app"`},
		"delete is not checked":   {req: request(admissionv1.Delete, nil), allowed: true},
		"bad object":              {req: request(admissionv1.Create, []byte(`{"metadata":42}`)), code: 400, msg: "decoding the ConfigMap"},
		"missing object":          {req: request(admissionv1.Create, nil), code: 400, msg: "CREATE of a ConfigMap without an object"},
		"other kinds are not ours": {req: func() *admissionv1.AdmissionRequest {
			r := request(admissionv1.Create, []byte(`{}`))
			r.Kind.Kind = "Secret"
			return r
		}(), allowed: true},
	} {
		t.Run(name, func(t *testing.T) {
			code, out, body := post(t, h, "application/json", review(tc.req))
			require.Equal(t, http.StatusOK, code, body)
			assert.Equal(t, "AdmissionReview", out.Kind)
			assert.Equal(t, "admission.k8s.io/v1", out.APIVersion)
			require.NotNil(t, out.Response)
			assert.Equal(t, types.UID("uid-1"), out.Response.UID)
			assert.Equal(t, tc.allowed, out.Response.Allowed)
			assert.Nil(t, out.Response.Patch)
			if !tc.allowed {
				require.NotNil(t, out.Response.Result)
				assert.Equal(t, tc.code, out.Response.Result.Code)
				assert.Contains(t, out.Response.Result.Message, tc.msg)
			}
		})
	}
}

func TestValidateGenerateName(t *testing.T) {
	req := request(admissionv1.Create, []byte(`{"metadata":{"generateName":"cm-"}}`))
	req.Name = ""
	resp := Rule{}.Validate(req)
	assert.False(t, resp.Allowed)
	assert.Contains(t, resp.Result.Message, `ConfigMap "cm-" (generateName)`)
}

func TestRuleNamespace(t *testing.T) {
	rule := Rule{Namespace: "other"}
	assert.True(t, rule.Validate(request(admissionv1.Create, configMapJSON(t, nil, nil))).Allowed, "other namespace: not enforced")
	assert.Nil(t, rule.Mutate(request(admissionv1.Create, configMapJSON(t, nil, nil))).Patch)
	rule.Namespace = "team"
	assert.False(t, rule.Validate(request(admissionv1.Create, configMapJSON(t, nil, nil))).Allowed)
}

func TestMutate(t *testing.T) {
	h := AdmissionHandler("mutate", Rule{}.Mutate)
	for name, tc := range map[string]struct {
		annotations map[string]string
		want        map[string]string
		patched     bool
	}{
		"no annotations":       {want: map[string]string{DefaultedAnnotation: "true"}, patched: true},
		"other annotations":    {annotations: map[string]string{"a/b": "c"}, want: map[string]string{"a/b": "c", DefaultedAnnotation: "true"}, patched: true},
		"empty annotations":    {annotations: map[string]string{}, want: map[string]string{DefaultedAnnotation: "true"}, patched: true},
		"already set":          {annotations: map[string]string{DefaultedAnnotation: "true"}, want: map[string]string{DefaultedAnnotation: "true"}},
		"set to another value": {annotations: map[string]string{DefaultedAnnotation: "false"}, want: map[string]string{DefaultedAnnotation: "false"}},
	} {
		t.Run(name, func(t *testing.T) {
			obj := configMapJSON(t, nil, tc.annotations)
			if tc.annotations != nil && len(tc.annotations) == 0 {
				// ObjectMeta omits an empty map; send it explicitly.
				obj = []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","annotations":{}}}`)
			}
			code, out, body := post(t, h, "application/json; charset=utf-8", review(request(admissionv1.Create, obj)))
			require.Equal(t, http.StatusOK, code, body)
			require.True(t, out.Response.Allowed)
			if !tc.patched {
				assert.Nil(t, out.Response.Patch)
				return
			}
			require.NotNil(t, out.Response.PatchType)
			assert.Equal(t, admissionv1.PatchTypeJSONPatch, *out.Response.PatchType)
			patch, err := jsonpatch.DecodePatch(out.Response.Patch)
			require.NoError(t, err)
			patched, err := patch.Apply(obj)
			require.NoError(t, err)
			var cm corev1.ConfigMap
			require.NoError(t, json.Unmarshal(patched, &cm))
			assert.Equal(t, tc.want, cm.Annotations)
		})
	}
}

func TestAdmissionHandlerBadRequests(t *testing.T) {
	h := AdmissionHandler("validate", Rule{}.Validate)
	good := review(request(admissionv1.Create, configMapJSON(t, nil, nil)))

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Equal(t, http.StatusMethodNotAllowed, w.Code)
	assert.Equal(t, http.MethodPost, w.Header().Get("Allow"))

	code, _, body := post(t, h, "text/plain", good)
	assert.Equal(t, http.StatusUnsupportedMediaType, code)
	assert.Contains(t, body, "expected application/json")

	code, _, body = post(t, h, "", good)
	assert.Equal(t, http.StatusUnsupportedMediaType, code, body)

	code, _, body = post(t, h, "application/json", []byte("{not json"))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "decoding the AdmissionReview")

	v1beta1 := strings.Replace(string(good), "admission.k8s.io/v1", "admission.k8s.io/v1beta1", 1)
	code, _, body = post(t, h, "application/json", []byte(v1beta1))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "only admission.k8s.io/v1 AdmissionReview is handled")

	code, _, body = post(t, h, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "no request")

	code, _, body = post(t, h, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "no uid")

	huge := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","object":{"data":"` + strings.Repeat("a", maxReviewBytes) + `"}}}`
	code, _, body = post(t, h, "application/json", []byte(huge))
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
	assert.Contains(t, body, "larger than")
}

func TestEscapeJSONPointer(t *testing.T) {
	assert.Equal(t, "evercert.io~1defaulted", escapeJSONPointer("evercert.io/defaulted"))
	assert.Equal(t, "a~0b~1c", escapeJSONPointer("a~b/c"))
}
