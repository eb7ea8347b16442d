package deploy

import (
	"context"
	"fmt"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/testcluster"
)

// request is one API request, as RBAC sees it. namespace "" is a
// cluster-scoped resource or a request across all namespaces; name "" is a
// request without a name (list and watch without a field selector on the
// name, create).
type request struct {
	verb, group, resource, subresource, namespace, name string
}

func (r request) String() string {
	s := r.verb + " " + r.resource
	if r.group != "" {
		s += "." + r.group
	}
	if r.subresource != "" {
		s += "/" + r.subresource
	}
	if r.name != "" {
		s += " " + r.name
	}
	if r.namespace != "" {
		s += " in " + r.namespace
	} else {
		s += " (cluster-wide)"
	}
	return s
}

// uses is one piece of code and the requests it makes.
type uses struct {
	code     string // where the requests are made or documented
	requests []request
}

func verbs(vs []string, group, resource, sub, ns, name string) []request {
	out := make([]request, 0, len(vs))
	for _, v := range vs {
		out = append(out, request{v, group, resource, sub, ns, name})
	}
	return out
}

// authorityUses are the requests of a authority.Authority keeping its CA
// in ns/secret (authority.Config.Client documents them). The Secret is
// pre-created by the base, so the create of a missing Secret never happens
// (RBAC could not restrict it to the one name: create carries none).
func authorityUses(ns, secret string) uses {
	return uses{
		code: "authority/authority.go Config.Client (Secret: get, list, watch, update by name; Leases: get, list, watch, create, update, delete)",
		requests: append(verbs([]string{"get", "list", "watch", "update"}, "", "secrets", "", ns, secret),
			verbs([]string{"get", "list", "watch", "create", "update", "delete"}, "coordination.k8s.io", "leases", "", ns, "")...),
	}
}

// publisherUses are the requests of a cabundle.Publisher for a target
// selected by name (cabundle/doc.go: list and watch with the field selector
// metadata.name, patch; get never).
func publisherUses(group, resource, name string) uses {
	return uses{
		code:     "cabundle/doc.go (named target: list, watch, patch by name)",
		requests: verbs([]string{"list", "watch", "patch"}, group, resource, "", "", name),
	}
}

// recorderUses are the requests of an events.k8s.io/v1 recorder writing
// into namespace ns (client-go tools/events: create, then patch a series).
func recorderUses(ns, code string) uses {
	return uses{code: code, requests: verbs([]string{"create", "patch"}, "events.k8s.io", "events", "", ns, "")}
}

// used says what each example really requests when run with its base's
// flags; denied lists near misses the base must not grant.
var used = map[string][]uses{
	"webhook": {
		authorityUses("evercert-example-webhook", "evercert-example-webhook-ca"),
		publisherUses("admissionregistration.k8s.io", "validatingwebhookconfigurations", "evercert-example-webhook"),
		publisherUses("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "evercert-example-webhook"),
		recorderUses("default", "example/webhook/app/webhook.go (the publisher's Events about cluster-scoped configurations go to namespace default)"),
		recorderUses("evercert-example-webhook", "server/build.go (the Authority's Events about the CA Secret, in its namespace)"),
	},
	"signer": {
		authorityUses("evercert-signer", "evercert-signer-ca"),
		{code: "podcert/signer.go (informer over every namespace, filtered by spec.signerName; get after a conflict; UpdateStatus)", requests: append(
			verbs([]string{"get", "list", "watch"}, "certificates.k8s.io", "podcertificaterequests", "", "", ""),
			request{"get", "certificates.k8s.io", "podcertificaterequests", "", "payments", "web-0"},
			request{"update", "certificates.k8s.io", "podcertificaterequests", "status", "payments", "web-0"},
			request{"sign", "certificates.k8s.io", "signers", "", "", "evercert.io/serving"},
		)},
		{code: "podcert/signer.go (verifies the pod: Pods get, Services list in the request's namespace)", requests: []request{
			{"get", "", "pods", "", "payments", "web-0"},
			{"list", "", "services", "", "payments", ""},
		}},
		recorderUses("payments", "example/signer/app/signer.go (Events about requests, in their namespace)"),
		recorderUses("evercert-signer", "server/build.go (the Authority's Events about the CA Secret, in its namespace)"),
		recorderUses("default", "example/signer/app/signer.go (the ClusterTrustBundle publisher's Events)"),
		{code: "cabundle/kind_clustertrustbundle.go (creates the bundle, then list, watch, patch by name; attest on the signer name)", requests: append(
			verbs([]string{"list", "watch", "patch"}, "certificates.k8s.io", "clustertrustbundles", "", "", "evercert.io:serving:ca"),
			request{"create", "certificates.k8s.io", "clustertrustbundles", "", "", ""},
			request{"attest", "certificates.k8s.io", "signers", "", "", "evercert.io/serving"},
		)},
	},
	"apiserver": {
		{code: "example/apiserver/app/auth.go (DelegatingAuthenticationOptions, DelegatingAuthorizationOptions)", requests: []request{
			{"create", "authentication.k8s.io", "tokenreviews", "", "", ""},
			{"create", "authorization.k8s.io", "subjectaccessreviews", "", "", ""},
			{"get", "", "configmaps", "", "kube-system", "extension-apiserver-authentication"},
			{"list", "", "configmaps", "", "kube-system", "extension-apiserver-authentication"},
			{"watch", "", "configmaps", "", "kube-system", "extension-apiserver-authentication"},
		}},
		{code: "example/apiserver/app/registration.go (get, then update to the desired spec)", requests: verbs([]string{"get", "update"}, "apiregistration.k8s.io", "apiservices", "", "", "v1alpha1.certificates.evercert.io")},
		publisherUses("apiregistration.k8s.io", "apiservices", "v1alpha1.certificates.evercert.io"),
	},
}

var denied = map[string][]request{
	"webhook": {
		{"get", "", "secrets", "", "evercert-example-webhook", "another-secret"},
		{"list", "", "secrets", "", "evercert-example-webhook", ""},
		{"list", "", "secrets", "", "", ""},
		{"create", "", "secrets", "", "evercert-example-webhook", ""},
		{"delete", "", "secrets", "", "evercert-example-webhook", "evercert-example-webhook-ca"},
		{"patch", "", "secrets", "", "evercert-example-webhook", "evercert-example-webhook-ca"},
		{"get", "", "secrets", "", "default", "evercert-example-webhook-ca"},
		{"get", "coordination.k8s.io", "leases", "", "kube-system", "kube-controller-manager"},
		{"create", "coordination.k8s.io", "leases", "", "default", ""},
		{"patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "", "another-webhook"},
		{"list", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", ""},
		{"create", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "", ""},
		{"delete", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "", "evercert-example-webhook"},
		{"update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", "evercert-example-webhook"},
		{"create", "events.k8s.io", "events", "", "kube-system", ""},
		// (list and watch on clustertrustbundles are granted to every
		// ServiceAccount by the bootstrap ClusterRoleBinding
		// system:cluster-trust-bundle-discovery, not by the base.)
		{"patch", "certificates.k8s.io", "clustertrustbundles", "", "", "evercert.io:serving:ca"},
		{"get", "", "configmaps", "", "evercert-example-webhook", "anything"},
	},
	"signer": {
		{"get", "", "secrets", "", "evercert-signer", "another-secret"},
		{"list", "", "secrets", "", "", ""},
		{"create", "", "secrets", "", "evercert-signer", ""},
		{"delete", "", "secrets", "", "evercert-signer", "evercert-signer-ca"},
		{"create", "coordination.k8s.io", "leases", "", "kube-system", ""},
		{"sign", "certificates.k8s.io", "signers", "", "", "kubernetes.io/kube-apiserver-client"},
		{"attest", "certificates.k8s.io", "signers", "", "", "other.example/serving"},
		{"update", "certificates.k8s.io", "podcertificaterequests", "", "payments", "web-0"},
		{"delete", "certificates.k8s.io", "podcertificaterequests", "", "payments", "web-0"},
		{"patch", "certificates.k8s.io", "clustertrustbundles", "", "", "kubernetes.io:other"},
		{"update", "certificates.k8s.io", "clustertrustbundles", "", "", "evercert.io:serving:ca"},
		{"delete", "certificates.k8s.io", "clustertrustbundles", "", "", "evercert.io:serving:ca"},
		{"list", "", "pods", "", "payments", ""},
		{"get", "", "services", "", "payments", "web"},
		{"create", "", "pods", "", "payments", ""},
		{"update", "certificates.k8s.io", "certificatesigningrequests", "approval", "", "csr-1"},
	},
	"apiserver": {
		{"create", "apiregistration.k8s.io", "apiservices", "", "", ""},
		{"update", "apiregistration.k8s.io", "apiservices", "", "", "v1.apps"},
		{"delete", "apiregistration.k8s.io", "apiservices", "", "", "v1alpha1.certificates.evercert.io"},
		{"get", "", "configmaps", "", "kube-system", "kube-proxy"},
		{"list", "", "configmaps", "", "kube-system", ""},
		{"get", "", "secrets", "", "evercert-example-apiserver", "anything"},
		{"create", "coordination.k8s.io", "leases", "", "evercert-example-apiserver", ""},
		{"create", "events.k8s.io", "events", "", "evercert-example-apiserver", ""},
	},
}

// TestServiceAccountPermissions creates each base's ServiceAccount and RBAC
// objects for real and asks the kube-apiserver, with SubjectAccessReviews
// as system:serviceaccount:<ns>:<sa>, whether every request of the used
// table is allowed and every near miss of the denied table is not.
// TestImagesServe runs the webhook and the signer as that ServiceAccount
// and sees them become ready: the table is not missing anything they do at
// start.
func TestServiceAccountPermissions(t *testing.T) {
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
				if !rbacKinds[o.GetKind()] {
					continue
				}
				if _, err := a.apply(ctx, o, false); err != nil {
					t.Fatalf("apply %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
			user := fmt.Sprintf("system:serviceaccount:%s:%s", b.namespace, b.serviceAccount)
			groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + b.namespace, "system:authenticated"}
			allowed := 0
			for _, u := range used[b.dir] {
				for _, r := range u.requests {
					if ok, reason := allowedSoon(ctx, t, cs, user, groups, r); !ok {
						t.Errorf("%s: %s is denied (%s), but %s makes it", user, r, reason, u.code)
					}
					allowed++
				}
			}
			for _, r := range denied[b.dir] {
				if ok, reason := access(ctx, t, cs, user, groups, r); ok {
					t.Errorf("%s: %s is allowed (%s); nothing the program does needs it", user, r, reason)
				}
			}
			t.Logf("%s: %d requests allowed, %d near misses denied", user, allowed, len(denied[b.dir]))
		})
	}
}

// rbacPropagation bounds how long allowedSoon waits for the API server's
// RBAC authorizer to see the objects just applied: a hang guard, not a
// timed assertion.
const rbacPropagation = 30 * time.Second

// allowedSoon asks whether r is allowed until it is, for at most
// rbacPropagation, backing off between asks. The RBAC authorizer reads
// Roles and bindings from informer caches, which may not yet hold a Role
// applied a moment ago (a loaded machine saw "role ... not found" for the
// webhook's events Role); a denial that outlasts the wait is real. The
// near misses are asked after every allowed request, so the caches then
// hold the base's RBAC, and a denial of them is not a lagging cache.
func allowedSoon(ctx context.Context, t *testing.T, cs kubernetes.Interface, user string, groups []string, r request) (bool, string) {
	t.Helper()
	deadline := time.Now().Add(rbacPropagation)
	b := backoff.New(50*time.Millisecond, time.Second)
	for {
		ok, reason := access(ctx, t, cs, user, groups, r)
		if ok || time.Now().After(deadline) {
			return ok, reason
		}
		time.Sleep(b.Next(nil))
	}
}

func access(ctx context.Context, t *testing.T, cs kubernetes.Interface, user string, groups []string, r request) (bool, string) {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: r.verb, Group: r.group, Resource: r.resource, Subresource: r.subresource,
			Namespace: r.namespace, Name: r.name,
		},
	}}
	got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview %s: %v", r, err)
	}
	return got.Status.Allowed, got.Status.Reason
}
