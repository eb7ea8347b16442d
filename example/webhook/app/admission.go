package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
)

// The built-in rule: in the namespaces it applies to, a ConfigMap must carry
// the label RequiredLabel (validating), and gets the annotation
// DefaultedAnnotation=true when it has none (mutating).
const (
	// RequiredLabel is the label every ConfigMap must carry, with a
	// non-empty value.
	RequiredLabel = "app"
	// DefaultedAnnotation is added, with value "true", to every ConfigMap
	// that lacks it.
	DefaultedAnnotation = "evercert.io/defaulted"
	// EnabledNamespaceLabel and EnabledNamespaceValue mark the namespaces the
	// rule applies to (unless --target-namespace is set).
	EnabledNamespaceLabel = "evercert.io/webhook"
	// EnabledNamespaceValue is the value of EnabledNamespaceLabel that
	// enables the rule.
	EnabledNamespaceValue = "enabled"
)

// Paths the handlers are served on.
const (
	// ValidatePath serves the validating webhook.
	ValidatePath = "/validate"
	// MutatePath serves the mutating webhook.
	MutatePath = "/mutate"
)

// Names of the webhooks inside the configurations (they must be fully
// qualified).
const (
	// ValidatingWebhookName is the name of the validating webhook.
	ValidatingWebhookName = "require-app-label.webhook.evercert.io"
	// MutatingWebhookName is the name of the mutating webhook.
	MutatingWebhookName = "default-annotation.webhook.evercert.io"
)

// maxReviewBytes bounds the request body: an AdmissionReview holds at most an
// object and its old version, each limited to about 3 MiB by the API server.
const maxReviewBytes = 8 << 20

var configMapKind = schema.GroupKind{Kind: "ConfigMap"}

// Rule is the webhook's policy. The API server's namespaceSelector decides
// which namespaces reach the webhook; Namespace, when set, is checked again
// here so that a misregistered webhook cannot enforce the rule elsewhere.
type Rule struct {
	// Namespace, when set, is the only namespace the rule applies to.
	Namespace string
}

// Validate denies a ConfigMap created or updated without a non-empty
// RequiredLabel; everything else is allowed.
func (r Rule) Validate(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	obj, resp := r.object(req)
	if obj == nil {
		return resp
	}
	if obj.Labels[RequiredLabel] != "" {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusForbidden,
		Reason:  metav1.StatusReasonForbidden,
		Message: fmt.Sprintf("ConfigMap %s in namespace %q must carry the label %q with a non-empty value", describe(req, obj), req.Namespace, RequiredLabel),
	}}
}

// Mutate adds DefaultedAnnotation=true, with a JSON patch, to a ConfigMap
// created or updated without it. An existing value, whatever it is, is left
// alone.
func (r Rule) Mutate(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	obj, resp := r.object(req)
	if obj == nil {
		return resp
	}
	if _, ok := obj.Annotations[DefaultedAnnotation]; ok {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var op jsonPatchOp
	if obj.Annotations == nil {
		op = jsonPatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{DefaultedAnnotation: "true"}}
	} else {
		op = jsonPatchOp{Op: "add", Path: "/metadata/annotations/" + escapeJSONPointer(DefaultedAnnotation), Value: "true"}
	}
	patch, err := json.Marshal([]jsonPatchOp{op})
	if err != nil {
		return errorResponse(http.StatusInternalServerError, fmt.Errorf("encoding patch: %w", err))
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &pt}
}

// object returns the metadata of the ConfigMap the rule applies to, or nil
// and the response to give when the request is none of its business (or
// carries no object it can read).
func (r Rule) object(req *admissionv1.AdmissionRequest) (*metav1.PartialObjectMetadata, *admissionv1.AdmissionResponse) {
	allow := &admissionv1.AdmissionResponse{Allowed: true}
	switch {
	case schema.GroupKind{Group: req.Kind.Group, Kind: req.Kind.Kind} != configMapKind:
		return nil, allow
	case req.Operation != admissionv1.Create && req.Operation != admissionv1.Update:
		return nil, allow
	case req.SubResource != "":
		return nil, allow
	case r.Namespace != "" && req.Namespace != r.Namespace:
		return nil, allow
	}
	if len(req.Object.Raw) == 0 {
		return nil, errorResponse(http.StatusBadRequest, fmt.Errorf("%s of a ConfigMap without an object", req.Operation))
	}
	var obj metav1.PartialObjectMetadata
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return nil, errorResponse(http.StatusBadRequest, fmt.Errorf("decoding the ConfigMap: %w", err))
	}
	return &obj, nil
}

// describe names the object for messages; a create with generateName has
// no name yet.
func describe(req *admissionv1.AdmissionRequest, obj *metav1.PartialObjectMetadata) string {
	switch {
	case req.Name != "":
		return fmt.Sprintf("%q", req.Name)
	case obj.Name != "":
		return fmt.Sprintf("%q", obj.Name)
	case obj.GenerateName != "":
		return fmt.Sprintf("%q (generateName)", obj.GenerateName)
	}
	return "(unnamed)"
}

type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// escapeJSONPointer escapes a key for use as a JSON pointer segment
// (RFC 6901).
func escapeJSONPointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func errorResponse(code int32, err error) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: code, Message: err.Error(),
	}}
}

// AdmitFunc decides one admission request. The UID of the response is set
// by the caller.
type AdmitFunc func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse

// AdmissionHandler serves admission.k8s.io/v1 AdmissionReviews with admit.
// name is used in logs. A request that is not a POST of a JSON
// AdmissionReview v1 with a request and a UID gets an HTTP error (405, 415,
// 413 or 400) with a plain-text reason, which the API server reports as a
// failed webhook call.
func AdmissionHandler(name string, admit AdmitFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logger := klog.FromContext(r.Context()).WithValues("webhook", name)
		review, code, err := readReview(w, r)
		if err != nil {
			logger.V(1).Info("Rejecting malformed admission request", "remote", r.RemoteAddr, "code", code, "err", err)
			if code == http.StatusMethodNotAllowed {
				w.Header().Set("Allow", http.MethodPost)
			}
			http.Error(w, err.Error(), code)
			return
		}
		req := review.Request
		logger = logger.WithValues("uid", req.UID, "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "operation", req.Operation)
		logger.V(5).Info("Admission request", "object", string(req.Object.Raw))

		resp := admit(req)
		resp.UID = req.UID
		switch {
		case resp.Result != nil && resp.Result.Code >= 500:
			logger.Error(errors.New(resp.Result.Message), "Admission failed")
		case !resp.Allowed:
			logger.V(2).Info("Denied", "code", resultCode(resp), "reason", resultMessage(resp))
		case resp.Patch != nil:
			logger.V(2).Info("Allowed with patch", "patch", string(resp.Patch))
		default:
			logger.V(4).Info("Allowed")
		}

		out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
		body, err := json.Marshal(out)
		if err != nil {
			logger.Error(err, "Encoding the admission response")
			http.Error(w, "encoding the response failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if _, err := w.Write(body); err != nil {
			logger.V(2).Info("Writing the admission response", "err", err)
		}
	})
}

// readReview reads and checks the AdmissionReview of r. On error it returns
// the HTTP status to answer with.
func readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, int, error) {
	if r.Method != http.MethodPost {
		return nil, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: POST an admission.k8s.io/v1 AdmissionReview", r.Method)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, http.StatusUnsupportedMediaType, fmt.Errorf("content type %q not supported: expected application/json", r.Header.Get("Content-Type"))
	}
	var review admissionv1.AdmissionReview
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxReviewBytes))
	if err := dec.Decode(&review); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body larger than %d bytes", maxReviewBytes)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("decoding the AdmissionReview: %w", err)
	}
	gvk := review.GroupVersionKind()
	switch {
	case gvk != admissionv1.SchemeGroupVersion.WithKind("AdmissionReview"):
		return nil, http.StatusBadRequest, fmt.Errorf("unsupported %q kind %q: only admission.k8s.io/v1 AdmissionReview is handled", review.APIVersion, review.Kind)
	case review.Request == nil:
		return nil, http.StatusBadRequest, errors.New("the AdmissionReview has no request")
	case review.Request.UID == "":
		return nil, http.StatusBadRequest, errors.New("the admission request has no uid")
	}
	return &review, 0, nil
}

func resultCode(r *admissionv1.AdmissionResponse) int32 {
	if r.Result == nil {
		return 0
	}
	return r.Result.Code
}

func resultMessage(r *admissionv1.AdmissionResponse) string {
	if r.Result == nil {
		return ""
	}
	return r.Result.Message
}
