package authority_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
)

// lostAnswer is an Authority's client whose first Secret update that
// changes tls.crt commits but gets no answer (a timeout), and while it
// commits another writer takes the replica names off the Secret: the
// replica's next step both reads its own record and has a write to make.
// That write conflicts once.
type lostAnswer struct {
	kubernetes.Interface
	armed, conflictNext *atomic.Bool
}

func (c lostAnswer) CoreV1() corev1client.CoreV1Interface {
	return lostAnswerCore{c.Interface.CoreV1(), c}
}

type lostAnswerCore struct {
	corev1client.CoreV1Interface
	c lostAnswer
}

func (c lostAnswerCore) Secrets(ns string) corev1client.SecretInterface {
	return lostAnswerSecrets{c.CoreV1Interface.Secrets(ns), c.c}
}

type lostAnswerSecrets struct {
	corev1client.SecretInterface
	c lostAnswer
}

func (s lostAnswerSecrets) Update(ctx context.Context, secret *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	if s.c.conflictNext.CompareAndSwap(true, false) {
		return nil, apierrors.NewConflict(corev1.Resource("secrets"), secret.Name, errors.New("another writer (test)"))
	}
	before, err := s.SecretInterface.Get(ctx, secret.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	out, err := s.SecretInterface.Update(ctx, secret, opts)
	if err != nil || bytes.Equal(before.Data[corev1.TLSCertKey], secret.Data[corev1.TLSCertKey]) || !s.c.armed.CompareAndSwap(true, false) {
		return out, err
	}
	other := out.DeepCopy()
	delete(other.Annotations, authority.ReplicaNamesAnnotation)
	if _, err := s.SecretInterface.Update(ctx, other, opts); err != nil {
		return nil, err
	}
	s.c.conflictNext.Store(true)
	return nil, apierrors.NewTimeoutError("the answer was lost (test)", 1)
}

// TestUnansweredUnsafeRotationIsCountedThroughAConflict: a replica that
// cannot list the Leases (RBAC) promotes an emergency's successor, counted
// unsafe. Its write commits but gets no answer; the next read shows the
// record it sent, so it counts the rotation then (simulator seed 599). If
// that step's own write conflicts, the step is decided again: the count
// must survive. It used to be looked at once and dropped with the
// conflicting step's result: the Secret recorded an unsafe rotation that
// no replica counted.
func TestUnansweredUnsafeRotationIsCountedThroughAConflict(t *testing.T) {
	client := fake.NewClientset()
	enforceResourceVersions(client)
	client.PrependReactor("list", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", errors.New("RBAC: list denied"))
	})
	clk := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	var armed, conflictNext atomic.Bool
	a, err := authority.New(authority.Config{
		Name: "unanswered", Namespace: "ns", SecretName: "ca", Client: lostAnswer{client, &armed, &conflictNext},
		ReplicaID: "r0", Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: clk,
	})
	require.NoError(t, err)
	background(t, a.Run)
	secret := func() *corev1.Secret {
		s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
		require.NoError(t, err)
		return s
	}
	step := func() {
		clk.Step(time.Second)
		time.Sleep(10 * time.Millisecond) // let the loops run on the fake clock's time
	}
	deadline := time.Now().Add(emergencyGuard)
	for a.Leaf() == nil || secret().Annotations[authority.ReplicaNamesAnnotation] == "" {
		require.True(t, time.Now().Before(deadline), "no leaf and replica names")
		step()
	}
	cas, err := pki.ParseCABundle(secret().Data[corev1.TLSCertKey])
	require.NoError(t, err)
	fp := authority.Fingerprint(cas[0])
	armed.Store(true)
	for {
		s := secret()
		s.Annotations[authority.CompromisedCAAnnotation] = fp
		if _, err := client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
			require.NoError(t, err)
			break
		}
	}
	for armed.Load() || conflictNext.Load() || secret().Annotations[authority.ReplicaNamesAnnotation] == "" {
		require.True(t, time.Now().Before(deadline), "the promotion (armed %v), the conflict (%v) and the names written back never happened", armed.Load(), conflictNext.Load())
		step()
	}
	for a.Status().UnsafeRotations == 0 && time.Now().Before(deadline) {
		step()
	}
	st := a.Status()
	assert.Equal(t, 1, st.RecordedUnsafeRotations, "the unsafe rotation recorded in the Secret")
	assert.Equal(t, 1, st.UnsafeRotations, "the unsafe rotation counted by the replica that made it (its write got no answer, its next write conflicted)")
	assert.Contains(t, st.LastUnsafeRotation, "unconfirmed by the other replicas")
}
