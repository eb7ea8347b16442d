package authority

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/apitest"
)

// secretWrites counts creates and updates of Secrets by anyone.
func secretWrites(client *fake.Clientset) *atomic.Int64 {
	n := &atomic.Int64{}
	for _, verb := range []string{"create", "update"} {
		client.PrependReactor(verb, "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
			n.Add(1)
			return false, nil, nil
		})
	}
	return n
}

// optimistic makes the fake API server keep resourceVersions and enforce
// optimistic concurrency on Secrets and Leases, as a real one does: an
// update whose resourceVersion is not the stored one is a Conflict. (The
// fake tracker keeps no resourceVersion and lets the last writer win,
// which hides races between replicas.)
func optimistic(client *fake.Clientset) {
	var rv atomic.Int64
	for _, r := range []struct {
		resource string
		gvr      schema.GroupVersionResource
		gr       schema.GroupResource
	}{
		{"secrets", corev1.SchemeGroupVersion.WithResource("secrets"), corev1.Resource("secrets")},
		{"leases", coordinationv1.SchemeGroupVersion.WithResource("leases"), coordinationv1.Resource("leases")},
	} {
		client.PrependReactor("create", r.resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
			obj := action.(clienttesting.CreateAction).GetObject().(metav1.Object)
			obj.SetResourceVersion(fmt.Sprint(rv.Add(1)))
			return false, nil, nil
		})
		client.PrependReactor("update", r.resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
			obj := action.(clienttesting.UpdateAction).GetObject().(metav1.Object)
			stored, err := client.Tracker().Get(r.gvr, obj.GetNamespace(), obj.GetName())
			if err != nil {
				return false, nil, nil
			}
			if cur := stored.(metav1.Object).GetResourceVersion(); obj.GetResourceVersion() != cur {
				return true, nil, apierrors.NewConflict(r.gr, obj.GetName(), fmt.Errorf("resourceVersion %q is not %q", obj.GetResourceVersion(), cur))
			}
			obj.SetResourceVersion(fmt.Sprint(rv.Add(1)))
			return false, nil, nil
		})
		client.PrependReactor("delete", r.resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
			d := action.(clienttesting.DeleteAction)
			want := d.GetDeleteOptions().Preconditions
			if want == nil || want.ResourceVersion == nil {
				return false, nil, nil
			}
			stored, err := client.Tracker().Get(r.gvr, d.GetNamespace(), d.GetName())
			if err != nil {
				return false, nil, nil
			}
			if cur := stored.(metav1.Object).GetResourceVersion(); *want.ResourceVersion != cur {
				return true, nil, apierrors.NewConflict(r.gr, d.GetName(), fmt.Errorf("precondition resourceVersion %q is not %q", *want.ResourceVersion, cur))
			}
			return false, nil, nil
		})
	}
}

// settle waits until every replica has finished its pass (the fake clock has
// `loops` waiters) and every replica holds what the Secret holds: nobody is
// about to write. A write ping-pong never settles; it is caught by maxWrites
// instead of by a timeout: more than maxWrites writes since the call fail
// the test at once.
func settle(t *testing.T, clk *clocktesting.FakeClock, loops int, client *fake.Clientset, writes *atomic.Int64, maxWrites int64, replicas ...*Authority) {
	t.Helper()
	start := writes.Load()
	deadline := time.Now().Add(guard)
	for {
		if n := writes.Load() - start; n > maxWrites {
			t.Fatalf("write ping-pong: %d Secret writes without the clock moving (at most %d expected); ca.crt now holds %d CAs", n, maxWrites, bundleLen(client))
		}
		if clk.Waiters() >= loops && agree(client, replicas) {
			rv := secretRV(client)
			// Still the same Secret and still every loop asleep: settled.
			if clk.Waiters() >= loops && agree(client, replicas) && rv == secretRV(client) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas never settled: %d writes since the step; %d of %d loops asleep, replicas agree with the Secret: %v; %s",
				writes.Load()-start, clk.Waiters(), loops, agree(client, replicas), apitest.Recent(client.Actions(), apitest.RecentWindow))
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func bundleLen(client *fake.Clientset) int {
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	if err != nil {
		return 0
	}
	return bytes.Count(s.Data[dynamiccert.SecretCAKey], []byte("BEGIN CERTIFICATE"))
}

func secretRV(client *fake.Clientset) string {
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return s.ResourceVersion
}

// agree reports whether every replica's bundle and signing CA are the
// Secret's.
func agree(client *fake.Clientset, replicas []*Authority) bool {
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, a := range replicas {
		a.mu.RLock()
		ok := a.hasState && bytes.Equal(a.bundle, s.Data[dynamiccert.SecretCAKey]) && bytes.Equal(a.cas.signing.CertPEM, s.Data["tls.crt"])
		a.mu.RUnlock()
		if !ok {
			return false
		}
	}
	return true
}

// attackAuthority is an Authority for localhost with a one-hour leaf and
// no replica Leases, changed by mutate.
func attackAuthority(t *testing.T, client *fake.Clientset, clk clock.WithTicker, name string, mutate func(*Config)) *Authority {
	t.Helper()
	cfg := Config{
		Name: name, Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: name,
		Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: clk, DisableReplicaAnnouncements: true,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := New(cfg)
	require.NoError(t, err)
	return a
}

// verifiesAt reports whether p's leaf chains to bundle at now.
func verifiesAt(t *testing.T, leaf *x509.Certificate, bundle []byte, now time.Time) error {
	t.Helper()
	require.NotNil(t, leaf)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(bundle))
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now})
	return err
}
