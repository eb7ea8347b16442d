package authority

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestAuthorityForbiddenNamesTheDeniedVerb: a denied write names the verb
// RBAC must allow for it. A denied create (a least-privilege Role grants no
// create, since resourceNames cannot limit it) was reported as "RBAC must
// allow get, list and watch", which the Role already did.
func TestAuthorityForbiddenNamesTheDeniedVerb(t *testing.T) {
	for _, tc := range []struct {
		name, verb, want string
		existing         bool
	}{
		{name: "create", verb: "create", want: "writing CA secret ns/ca: forbidden (RBAC must allow create on secrets in the namespace, or pre-create the Secret and set DisableCreate)"},
		{name: "update", verb: "update", existing: true, want: "writing CA secret ns/ca: forbidden (RBAC must allow update on this Secret)"},
		{name: "get", verb: "get", want: "reading CA secret ns/ca: forbidden (RBAC must allow get, list and watch on this Secret)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			clk := clocktesting.NewFakeClock(testNow)
			if tc.existing {
				// A pre-created Secret that holds nothing yet (the deploy
				// bases ship one): the first run writes a CA into it.
				empty := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca"}}
				_, err := client.CoreV1().Secrets("ns").Create(context.Background(), empty, metav1.CreateOptions{})
				require.NoError(t, err)
			}
			client.PrependReactor(tc.verb, "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "ca", errors.New("RBAC: access denied"))
			})
			a := newTestAuthority(t, client, clk, "authority-forbidden-"+tc.name)
			err := a.RunOnce(context.Background())
			require.ErrorContains(t, err, tc.want)
		})
	}
}
