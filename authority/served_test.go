package authority

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/evercert/evercert/dynamiccert"
)

// TestAuthorityServedChainsAnnounced: two replicas of one Authority
// announce their leaf (the certificate, never the key) in their Leases, and
// each lists both leaves as served; ServedBy lists a provider's own chain.
func TestAuthorityServedChainsAnnounced(t *testing.T) {
	client := fake.NewClientset()
	newReplica := func(id string) *Authority {
		a, err := New(Config{
			Name: "served-" + id, Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: id,
			Hosts: []string{"localhost"}, Lifetime: 10 * time.Minute, LeaseDuration: 20 * time.Second,
		})
		require.NoError(t, err)
		runInBackground(t, a.Run)
		return a
	}
	a, b := newReplica("a"), newReplica("b")
	serials := func(chains []dynamiccert.ServedChain) map[string]string {
		out := map[string]string{}
		for _, c := range chains {
			out[c.Server] = c.Chain[0].SerialNumber.String()
		}
		return out
	}
	waitFor(t, "both replicas' leaves served, as seen by each", func() bool {
		la, lb := a.Leaf(), b.Leaf()
		if la == nil || lb == nil {
			return false
		}
		want := map[string]string{"replica/a": la.SerialNumber.String(), "replica/b": lb.SerialNumber.String()}
		return assert.ObjectsAreEqual(want, serials(a.ServedChains())) && assert.ObjectsAreEqual(want, serials(b.ServedChains()))
	})
	l, err := client.CoordinationV1().Leases("ns").Get(context.Background(), replicaLeaseName("ca", "a"), metav1.GetOptions{})
	require.NoError(t, err)
	ann := l.Annotations[LeafAnnotation]
	assert.Contains(t, ann, "BEGIN CERTIFICATE")
	assert.False(t, strings.Contains(ann, "PRIVATE KEY"), "the announcement holds no key")

	own := dynamiccert.ServedBy(a).ServedChains()
	require.Len(t, own, 1)
	assert.Equal(t, a.Leaf().SerialNumber, own[0].Chain[0].SerialNumber)
	assert.Equal(t, a.Name(), own[0].Server)
}
