package authority

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
	"github.com/evercert/evercert/internal/pki"
)

// oldRotator stands in for the rotator adopted from, in a pod that has not
// been replaced yet: each rewrite makes a new CA and a leaf it signed, as
// cert-controller's refreshCerts(true) does (NotBefore an hour back, ten
// years of validity: its defaults) or cert-manager's DynamicAuthority's
// regenerateCA, and writes them over the tool's keys with an Update of the
// Secret as read, leaving every other key and annotation as they are.
type oldRotator struct {
	t      *testing.T
	client *fake.Clientset
	clk    *clocktesting.FakeClock
	layout SecretLayout
	n      int
	latest foreignCA
	// lifetime of each CA and leaf; zero: ten years, cert-controller's
	// default.
	lifetime time.Duration
}

func (r *oldRotator) make() map[string][]byte {
	r.t.Helper()
	r.n++
	lifetime := r.lifetime
	if lifetime == 0 {
		lifetime = 10 * 365 * 24 * time.Hour
	}
	now := r.clk.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: fmt.Sprintf("%s-ca-%d", r.layout, r.n), KeyType: pki.ECDSAP256, Now: now, Backdate: time.Hour, Lifetime: lifetime})
	require.NoError(r.t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "localhost", DNSNames: []string{"localhost"}, KeyType: pki.ECDSAP256, Now: now, Backdate: time.Hour, Lifetime: lifetime})
	require.NoError(r.t, err)
	r.latest = foreignCA{ca: ca, leaf: leaf}
	if r.layout == LayoutCertManager {
		return r.latest.certManager()
	}
	return r.latest.certController()
}

// rewrite writes a new CA and leaf; a conflict is read again and retried,
// as cert-controller's backoff does.
func (r *oldRotator) rewrite() {
	r.t.Helper()
	data := r.make()
	for range 10 {
		s := getSecret(r.t, r.client).DeepCopy()
		for k, v := range data {
			s.Data[k] = v
		}
		_, err := r.client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		require.NoError(r.t, err)
		return
	}
	r.t.Fatal("cert-controller's rewrite conflicted 10 times")
}

func countCerts(t *testing.T, bundle []byte) int {
	t.Helper()
	certs, err := pki.ParseCABundle(bundle)
	require.NoError(t, err)
	return len(certs)
}

// TestAdoptWhileOldRotatorStillWrites is issue 27 §8 bullet 1: a rolling
// update straight from cert-controller AddRotator pods to evercert, so the
// old rotator keeps rewriting the Secret (a new CA and leaf every 20 fake
// seconds) after two evercert replicas adopted it. Each replica must stop
// adopting: it keeps serving what it has, reports Stalled with a reason
// naming the Secret and the layout, keeps its ca-rotation readiness check
// green (it serves a valid leaf, and the rolling update removes the old
// pods only once the new ones are Ready: review finding 1 of the first
// attempt, which failed readiness and deadlocked the rollout), sends one
// Warning Event and counts every rewrite, and its ca.crt does not grow.
// Once the rotator stops, the replicas adopt its last CA once, ca.crt
// holds at most three CAs, and both the replicas' leaves and the old
// rotator's last leaf verify against it in real TLS handshakes.
func TestAdoptWhileOldRotatorStillWrites(t *testing.T) {
	// cert-manager's layout is the Authority's own: its webhook's rewrite
	// keeps the Authority's annotations, and is told from a peer's write by
	// WrittenCAAnnotation, which names the CA the Authority wrote
	// (TestForeignWriterHoldNeverTakesPeersEmergency,
	// TestForeignWriterNoHoldOnPeersRecreatedSecret).
	for _, layout := range []SecretLayout{LayoutCertController, LayoutCertManager} {
		t.Run(string(layout), func(t *testing.T) { testAdoptWhileOldRotatorStillWrites(t, layout) })
	}
}

func testAdoptWhileOldRotatorStillWrites(t *testing.T, layout SecretLayout) {
	clk := clocktesting.NewFakeClock(testNow)
	client := fake.NewClientset()
	old := &oldRotator{t: t, client: client, clk: clk, layout: layout}
	// written reports that a replica wrote the Secret (adopted it) since
	// the old rotator's last rewrite: cert-controller's ca.key is gone,
	// or ca.crt holds more than cert-manager's one CA.
	written := func() bool {
		s := getSecret(t, client)
		if layout == LayoutCertManager {
			return countCerts(t, s.Data["ca.crt"]) > 1
		}
		_, cc := s.Data["ca.key"]
		return !cc
	}
	_, err := client.CoreV1().Secrets("ns").Create(context.Background(), opaqueSecret(old.make()), metav1.CreateOptions{})
	require.NoError(t, err)
	optimistic(client)
	first := old.latest
	recA, recB := certreporttest.NewRecorder(), certreporttest.NewRecorder()
	a := runAdopting(t, client, clk, "overlap-a-"+string(layout), layout, func(c *Config) { c.DisableReplicaAnnouncements, c.EventRecorder = false, recA })
	b := runAdopting(t, client, clk, "overlap-b-"+string(layout), layout, func(c *Config) { c.DisableReplicaAnnouncements, c.EventRecorder = false, recB })
	replicas := []*Authority{a, b}
	waitFor(t, "both replicas' leaves", func() bool { return a.Leaf() != nil && b.Leaf() != nil })
	if layout == LayoutCertController {
		waitFor(t, "the adoption", written)
	}
	waitWaiters(t, clk, 2)
	require.NoError(t, a.Leaf().CheckSignatureFrom(first.ca.Cert), "cert-controller's CA signs after the adoption")
	bundleAtStart := countCerts(t, getSecret(t, client).Data["ca.crt"])
	certmetricstest.Gather(t) // the series exist from here on
	rewrites := func(r *Authority) float64 {
		return certmetricstest.Value(t, "evercert_ca_secret_foreign_rewrites_total", map[string]string{"provider": r.Name()})
	}
	before := map[*Authority]float64{a: rewrites(a), b: rewrites(b)}

	// The overlap: the old pods keep rotating while the new ones run.
	const overlap = 12
	for k := 1; k <= overlap; k++ {
		old.rewrite()
		// Each replica has read the rewrite once it counted it; on a
		// replica that adopts it instead, once ca.key is gone again.
		// The count goes up when the rewrite is read, before the held
		// state (with the rewrite's CA) is served: wait for both.
		waitFor(t, fmt.Sprintf("both replicas to read rewrite %d", k), func() bool {
			return written() || rewrites(a)-before[a] >= float64(k) && rewrites(b)-before[b] >= float64(k) &&
				caInBundle(t, a.CurrentCABundleContent(), old.latest.ca) && caInBundle(t, b.CurrentCABundleContent(), old.latest.ca)
		})
		for _, r := range replicas {
			s := r.Status()
			require.True(t, s.Stalled, "%s: Stalled while the old rotator keeps writing (rewrite %d); status %+v", r.Name(), k, s)
			require.Equal(t, PhaseStalled, s.Phase, r.Name())
			for _, want := range []string{"another writer keeps rewriting", "ns/ca", string(layout)} {
				require.Contains(t, s.ForeignWriter, want, r.Name())
			}
			require.False(t, s.LeafExpired, r.Name())
			require.NoError(t, RotationCheck(r).Check(nil), "%s: readiness stays green while the old rotator keeps writing and a valid leaf is served: the rolling update that removes the old pods waits for this pod to be Ready", r.Name())
			bundle := r.CurrentCABundleContent()
			require.Equal(t, bundleAtStart+1, countCerts(t, bundle), "%s: ca.crt does not grow with each rewrite (it adds the old rotator's current CA only)", r.Name())
			require.NoError(t, handshakeWith(t, r, first.ca.CertPEM, clk.Now), "%s keeps serving a leaf of the CA clients trust", r.Name())
			require.NoError(t, handshakeWith(t, r, bundle, clk.Now), "%s's leaf verifies with the bundle it publishes", r.Name())
			oldPod, err := dynamiccertificates.NewStaticCertKeyContent("old-pod", old.latest.leaf.CertPEM, old.latest.leaf.KeyPEM)
			require.NoError(t, err)
			require.NoError(t, handshakeWith(t, oldPod, bundle, clk.Now), "the old rotator's current leaf verifies with %s's bundle: its publisher never takes that trust away", r.Name())
		}
		clk.Step(20 * time.Second)
	}
	for _, r := range replicas {
		assert.Equal(t, float64(overlap), rewrites(r)-before[r], "%s counts every rewrite of the overlap", r.Name())
	}
	for _, rec := range []struct {
		a   *Authority
		got []string
	}{{a, certreporttest.Drain(recA)}, {b, certreporttest.Drain(recB)}} {
		var warned []string
		for _, e := range rec.got {
			if strings.HasPrefix(e, "Warning "+dynamiccert.ReasonForeignCASecretWriter+" ") {
				warned = append(warned, e)
			}
		}
		require.Len(t, warned, 1, "%s: one Warning Event for the episode: %q", rec.a.Name(), rec.got)
		assert.Contains(t, warned[0], "ns/ca")
		assert.True(t, strings.HasSuffix(warned[0], "{kind=Secret,apiVersion=v1}"), warned[0])
	}

	// The old pods are gone: the replicas adopt the last CA once.
	last := old.latest
	writes := secretWrites(client)
	for steps := 0; ; steps++ {
		require.Less(t, steps, 60, "no adoption within ten minutes of the old rotator's last write")
		clk.Step(10 * time.Second)
		waitWaiters(t, clk, 2)
		s := getSecret(t, client)
		if written() && !a.Status().Stalled && !b.Status().Stalled && string(s.Data["tls.crt"]) == string(last.ca.CertPEM) {
			break
		}
	}
	// Let every replica settle on the result, then nothing more is written.
	for range 6 {
		clk.Step(10 * time.Second)
		waitWaiters(t, clk, 2)
	}
	assert.LessOrEqual(t, writes.Load(), int64(3), "one adoption (a replica's attempt may conflict, a replica may write back the CA its leaf came from)")
	s := getSecret(t, client)
	published := s.Data["ca.crt"]
	n := countCerts(t, published)
	t.Logf("%s: ca.crt holds %d CAs after the adoption that ended a %d-rewrite overlap", layout, n, overlap)
	assert.LessOrEqual(t, n, 3, "ca.crt keeps only the CAs a served leaf needs")
	assert.Contains(t, string(published), string(pki.EncodeCertPEM(last.ca.Cert.Raw)), "the old rotator's last CA is trusted: its pods served its leaf to the end")
	assert.Contains(t, string(published), string(pki.EncodeCertPEM(first.ca.Cert.Raw)), "the CA the replicas served leaves of during the overlap stays trusted")
	for _, r := range replicas {
		assert.NoError(t, r.LastError(), r.Name())
		assert.NoError(t, RotationCheck(r).Check(nil), r.Name())
		assert.Equal(t, string(published), string(r.CurrentCABundleContent()), "%s publishes what the Secret holds", r.Name())
		require.NoError(t, handshakeWith(t, r, published, clk.Now), "%s's leaf verifies with the published bundle", r.Name())
	}
	oldPod, err := dynamiccertificates.NewStaticCertKeyContent("old-pod", last.leaf.CertPEM, last.leaf.KeyPEM)
	require.NoError(t, err)
	require.NoError(t, handshakeWith(t, oldPod, published, clk.Now), "the old rotator's last leaf verifies with the published bundle")
}
