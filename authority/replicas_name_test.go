package authority

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestReplicaLeaseNamesDoNotCollide: the Authority of Secret "a" with
// replica "b-c" and the Authority of Secret "a-b" with replica "c" share a
// namespace. Both used to announce themselves in Lease "a-b-c", so each
// renewal overwrote the other's announcement (and its authority label):
// one Authority lost sight of its replica, the other waited for a replica
// that is not its own.
func TestReplicaLeaseNamesDoNotCollide(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	for _, r := range []struct{ secret, id string }{{"a", "b-c"}, {"a-b", "c"}} {
		a, err := New(Config{
			Name: "lease-name-" + r.secret, Namespace: "ns", SecretName: r.secret, Client: client, ReplicaID: r.id,
			Hosts: []string{"localhost"}, Clock: clk,
		})
		require.NoError(t, err)
		runInBackground(t, a.Run)
	}
	announced := func(secret string) []string {
		l, err := client.CoordinationV1().Leases("ns").List(context.Background(), metav1.ListOptions{LabelSelector: LeaseLabel + "=" + secret})
		require.NoError(t, err)
		var holders []string
		for _, lease := range l.Items {
			if lease.Spec.HolderIdentity != nil {
				holders = append(holders, lease.Name+"="+*lease.Spec.HolderIdentity)
			}
		}
		return holders
	}
	waitFor(t, "both replicas announced", func() bool { return len(announced("a")) == 1 && len(announced("a-b")) == 1 })
	// A few renewals each: neither overwrites the other.
	for range 3 {
		clk.Step(time.Minute) // a third of the default lease duration
		waitFor(t, "both announcements still there", func() bool { return len(announced("a")) == 1 && len(announced("a-b")) == 1 })
	}
	all, err := client.CoordinationV1().Leases("ns").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	assert.Len(t, all.Items, 2, "one Lease per replica: %v, %v", announced("a"), announced("a-b"))
	assert.True(t, strings.HasSuffix(announced("a")[0], "=b-c"), "%v", announced("a"))
	assert.True(t, strings.HasSuffix(announced("a-b")[0], "=c"), "%v", announced("a-b"))
}

// TestReplicaLeaseName: names are valid DNS-1123 labels of at most 63
// characters that start with the readable pair, and differ whenever the
// pair differs, however long or oddly spelled.
func TestReplicaLeaseName(t *testing.T) {
	long := strings.Repeat("x", 300)
	pairs := [][2]string{
		{"a", "b-c"}, {"a-b", "c"}, {"ca", "pod-0"}, {"ca.example", "Pod_0"}, {long, "r"}, {long, "s"}, {"ca", long}, {"ca", long + "y"}, {"ca", ""},
	}
	seen := map[string][2]string{}
	for _, p := range pairs {
		name := replicaLeaseName(p[0], p[1])
		assert.Empty(t, validation.IsDNS1123Label(name), "%q", name)
		assert.LessOrEqual(t, len(name), validation.DNS1123LabelMaxLength, "%q", name)
		if prev, dup := seen[name]; dup {
			t.Errorf("%v and %v share Lease %q", prev, p, name)
		}
		seen[name] = p
	}
	assert.True(t, strings.HasPrefix(replicaLeaseName("ca", "pod-0"), "ca-pod-0-"), replicaLeaseName("ca", "pod-0"))
}

// TestAuthorityLeaseLabelValue: the label value is always a valid label
// value of at most 63 characters; a Secret name that already is one (every
// Secret name of up to 63 characters) is kept as it is, so replicas of
// earlier versions still see the Leases during a rolling upgrade; a longer
// name gets a readable prefix and a hash, distinct per name. The selector
// matches the label. Before, the name itself was the value: a Secret name
// of 64 characters or more made every Lease write Invalid on a real API
// server (cmd/evercert TestCLIStatusLongSecretName shows it).
func TestAuthorityLeaseLabelValue(t *testing.T) {
	long := strings.Repeat("a", 64)
	dotted := strings.Repeat("webhook.", 10) + "ca" // 82 characters, '.' at the cut
	for _, tc := range []struct {
		secret, want string // want "" : hashed, checked below
	}{
		{"ca", "ca"},
		{"my-webhook.ca", "my-webhook.ca"},
		{strings.Repeat("b", 63), strings.Repeat("b", 63)},
		{long, ""},
		{long + "b", ""},
		{strings.Repeat("c", 253), ""},
		{dotted, ""},
		{strings.Repeat("-", 70), ""},
		{"Ünïcode/name with spaces", ""},
		{"", ""},
	} {
		got := LeaseLabelValue(tc.secret)
		assert.Empty(t, validation.IsValidLabelValue(got), "%q -> %q", tc.secret, got)
		if tc.want != "" {
			assert.Equal(t, tc.want, got, "a valid label value is kept")
		} else if tc.secret != "" {
			assert.NotEqual(t, tc.secret, got)
			assert.Regexp(t, `(^|-)[0-9a-f]{16}$`, got, "%q: ends in the hash", tc.secret)
		}
		sel, err := labels.Parse(LeaseSelector(tc.secret))
		require.NoError(t, err, "%q", tc.secret)
		assert.True(t, sel.Matches(labels.Set{LeaseLabel: got}), "%q: the selector matches the label", tc.secret)
	}
	assert.True(t, strings.HasPrefix(LeaseLabelValue(long), strings.Repeat("a", 46)+"-"), LeaseLabelValue(long))
	assert.True(t, strings.HasPrefix(LeaseLabelValue(dotted), "webhook.webhook.webhook.webhook.webhook.webho"), LeaseLabelValue(dotted))
	assert.NotEqual(t, LeaseLabelValue(long), LeaseLabelValue(long+"b"), "names that share the prefix differ")
	assert.NotEqual(t, LeaseLabelValue(long), LeaseLabelValue(long[:63]), "a long name is not its cut")
}

// TestReplicasOfLongSecretNameSeeEachOther: two replicas of the Authority
// of a Secret named with 70 characters announce themselves in Leases whose
// label is valid, and each sees the other (ServedChains lists both).
// Before, the name was the label value and the Lease informer panicked on
// the selector ("invalid selector ...: must be no more than 63 bytes");
// TestCLIStatusLongSecretName checks the same on a real kube-apiserver.
func TestReplicasOfLongSecretNameSeeEachOther(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	clk := clocktesting.NewFakeClock(testNow)
	secret := strings.Repeat("s", 70)
	var replicas []*Authority
	for _, id := range []string{"r0", "r1"} {
		a, err := New(Config{
			Namespace: "ns", SecretName: secret, Client: client, ReplicaID: id, Hosts: []string{"localhost"}, Clock: clk,
		})
		require.NoError(t, err)
		runInBackground(t, a.Run)
		replicas = append(replicas, a)
	}
	for _, a := range replicas {
		waitFor(t, a.ReplicaID()+" sees both replicas", func() bool { return len(a.ServedChains()) == 2 })
	}
	l, err := client.CoordinationV1().Leases("ns").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, l.Items, 2)
	for _, lease := range l.Items {
		v := lease.Labels[LeaseLabel]
		assert.Empty(t, validation.IsValidLabelValue(v), "Lease %s label %q", lease.Name, v)
		assert.Empty(t, validation.IsDNS1123Subdomain(lease.Name), "Lease name %q", lease.Name)
	}
}
