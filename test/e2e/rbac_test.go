//go:build e2e

package e2e

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// applySignerRBAC creates example/signer/rbac.yaml for user, with the
// Role limited to the CA Secret secret.
func applySignerRBAC(t *testing.T, admin kubernetes.Interface, user, secret string) {
	applyExampleRBAC(t, admin, "../../example/signer/rbac.yaml", user, secret)
}

// applyWebhookRBAC creates example/webhook/rbac.yaml for user, with the
// Role limited to the CA Secret secret and the ClusterRoles' named rules
// limited to the configuration names configs.
func applyWebhookRBAC(t *testing.T, admin kubernetes.Interface, user, secret string, configs ...string) {
	applyExampleRBAC(t, admin, "../../example/webhook/rbac.yaml", user, secret, configs...)
}

// applyExampleRBAC creates the RBAC objects of an example's YAML at path,
// every binding's subject replaced by user, the Roles in ns with their
// named rules limited to secret and, when configs are given, the
// ClusterRoles' named rules limited to configs. So the e2e tests run with
// exactly the documented permissions.
func applyExampleRBAC(t *testing.T, admin kubernetes.Interface, path, user, secret string, configs ...string) {
	t.Helper()
	ctx := context.Background()
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	limit := func(rules []rbacv1.PolicyRule, names []string) {
		for i := range rules {
			if len(rules[i].ResourceNames) > 0 && len(names) > 0 {
				rules[i].ResourceNames = names
			}
		}
	}
	for _, obj := range decodeYAML(t, path) {
		var err error
		switch o := obj.(type) {
		case *rbacv1.Role:
			o.Namespace = ns
			limit(o.Rules, []string{secret})
			_, err = admin.RbacV1().Roles(ns).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			o.Namespace, o.Subjects = ns, subjects
			_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			limit(o.Rules, configs)
			_, err = admin.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			o.Subjects = subjects
			_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected object %T", path, obj)
		}
		require.NoError(t, err, path)
	}
}
