package pkcs11_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/testcluster"
)

// TestAuthorityCAKeyInSoftHSMOnRealAPIServer: two replicas of an Authority
// whose CA key lives in SoftHSM2, against a real kube-apiserver and etcd:
// the Secret the API server stores (and etcd backs up) holds the
// certificates and the key's label, never a private key; both replicas
// serve leaves from the one CA over TLS.
func TestAuthorityCAKeyInSoftHSMOnRealAPIServer(t *testing.T) {
	c := testcluster.Start(t)
	client, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	label, pin := newToken(t)
	clk := clock.RealClock{}
	a1 := newAuthority(t, client, clk, "hsm-apiserver-1", "replica-1", newKeySource(t, label, pin))
	a2 := newAuthority(t, client, clk, "hsm-apiserver-2", "replica-2", newKeySource(t, label, pin))
	run(t, a1)
	run(t, a2)
	waitFor(t, "both replicas' leaves", nil, func() bool { return a1.Leaf() != nil && a2.Leaf() != nil })

	s := getSecret(t, client)
	assertNoPrivateKey(t, s)
	if s.Type != corev1.SecretTypeOpaque {
		t.Errorf("Secret type %q, want Opaque", s.Type)
	}
	ref := string(s.Data[authority.KeyRefKey])
	ca := signingCA(t, s)
	assertKeyInToken(t, newKeySource(t, label, pin), ref, ca)
	for _, a := range []*authority.Authority{a1, a2} {
		if leaf := handshake(t, serve(t, a), s.Data[dynamiccert.SecretCAKey], clk); leaf.CheckSignatureFrom(ca) != nil {
			t.Fatalf("%s serves a leaf the CA in the token did not sign", a.ReplicaID())
		}
	}
}
