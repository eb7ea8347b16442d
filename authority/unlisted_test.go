package authority_test

import (
	"crypto/x509"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
)

// gateObserver confirms the CAs it was opened for only: a replica whose
// consumers lag behind.
type gateObserver struct {
	mu    sync.Mutex
	open  bool
	holds map[string]bool
	asked atomic.Int64
}

func (g *gateObserver) Name() string { return "lagging-consumers" }

func (g *gateObserver) Observed(ca *x509.Certificate) bool {
	g.asked.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open || g.holds[authority.Fingerprint(ca)]
}

func (g *gateObserver) let() {
	g.mu.Lock()
	g.open = true
	g.mu.Unlock()
}

// TestNewReplicaThatCannotListLeasesDoesNotPromote: a process started in an
// emergency whose list of the replicas' Leases times out (not RBAC: the API
// server is slow) knows no peer. Before, it took that empty view for
// "nobody lacks the successor" and promoted it while a live peer's
// consumers still lacked it (the simulator's S2, seed 4235 of the wider
// set). Now it waits, says so in Status, and the rotation completes once
// the list succeeds and the peer holds the successor.
func TestNewReplicaThatCannotListLeasesDoesNotPromote(t *testing.T) {
	var failLists atomic.Bool
	w := newEmergencyWorldWith(t, func(c *fake.Clientset) {
		c.PrependReactor("list", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
			if failLists.Load() {
				return true, nil, apierrors.NewTimeoutError("the server was slow to list the leases", 1)
			}
			return false, nil, nil
		})
	})
	cas, err := pki.ParseCABundle(w.secret().Data["tls.crt"])
	require.NoError(t, err)
	compromised := authority.Fingerprint(cas[0])
	gate := &gateObserver{holds: map[string]bool{compromised: true}}
	w.replicas[2].AddObserver(gate)
	for range 3 {
		w.step(time.Second)
	}

	failLists.Store(true)
	w.markCompromised(compromised)
	w.step(time.Second)
	signing := func() string {
		c, err := pki.ParseCABundle(w.secret().Data["tls.crt"])
		require.NoError(t, err)
		return authority.Fingerprint(c[0])
	}
	require.Equal(t, compromised, signing(), "the successor waits for replica r2, whose consumers lack it")

	late, err := authority.New(authority.Config{
		Name: "emergency-r3", Namespace: "ns", SecretName: "ca", Client: w.client,
		ReplicaID: "r3", Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: w.clk,
	})
	require.NoError(t, err)
	background(t, late.Run)
	for range 30 {
		w.step(time.Second)
		require.Equal(t, compromised, signing(), "replica r3, which could not list the Leases, promoted the successor while replica r2's consumers lack it")
	}
	st := late.Status()
	require.NotNil(t, st.Successor, "r3 sees the successor")
	assert.True(t, slices.ContainsFunc(st.Successor.Pending, func(p string) bool { return strings.Contains(p, "not listed") }),
		"r3 says why it waits: %v", st.Successor.Pending)
	assert.Nil(t, late.Leaf(), "r3 signs no leaf with the compromised CA")

	// The list succeeds again and r2's consumers get the successor: the
	// emergency completes, r3 included.
	failLists.Store(false)
	gate.let()
	for range 600 {
		if signing() != compromised && late.Leaf() != nil {
			break
		}
		w.step(time.Second)
	}
	require.NotEqual(t, compromised, signing(), "the successor signs once every replica holds it")
	require.NotNil(t, late.Leaf(), "r3 serves a leaf of the successor")
	assert.Zero(t, late.Status().UnsafeRotations)
}

// TestEmergencyWhileNoReplicaCanListLeasesGoesOnCountedUnsafe: no replica
// can list the Leases (a 503 from the start: the API server, or the
// coordination API, is not served). The wait for a first list is bounded
// by a lease duration: past it each replica is blind, as when RBAC forbids
// the list, and the emergency goes on, its promotion counted unsafe and
// recorded. Before the bound, a review found it waiting for ever with the
// compromised CA signing and nothing but Status's pending list saying so.
func TestEmergencyWhileNoReplicaCanListLeasesGoesOnCountedUnsafe(t *testing.T) {
	w := newEmergencyWorldWith(t, func(c *fake.Clientset) {
		c.PrependReactor("list", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewServiceUnavailable("the leases cannot be listed")
		})
	})
	cas, err := pki.ParseCABundle(w.secret().Data["tls.crt"])
	require.NoError(t, err)
	compromised := authority.Fingerprint(cas[0])
	w.markCompromised(compromised)
	signing := func() string {
		c, err := pki.ParseCABundle(w.secret().Data["tls.crt"])
		require.NoError(t, err)
		return authority.Fingerprint(c[0])
	}
	marked := w.clk.Now()
	for signing() == compromised {
		require.Less(t, w.clk.Since(marked), 15*time.Minute, "the compromised CA still signs: no replica has listed the Leases")
		w.step(30 * time.Second)
	}
	for range 3 {
		w.step(time.Second)
	}
	for _, a := range w.replicas {
		assert.Equal(t, 1, a.Status().RecordedUnsafeRotations, "%s: the promotion, made blind, is recorded unsafe", a.Name())
	}
}
