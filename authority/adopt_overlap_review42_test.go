package authority

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestForeignWriterTrimGapForPeerStartedDuringOverlapHeals (review42,
// finding 1, a known gap: docs/migrating.md): b starts while the old
// rotator still writes, adopts the old rotator's CA it reads first (its
// first read: O2) and writes it, and the old rotator rewrites (O3) before
// a ever reads b's write. a never had O2, and a Lease announces b's leaf,
// not its CA, so a's trim leaves O2 out of ca.crt. The gap ends at b's
// next check, which a's write wakes (the watch): b writes O2 back, and a
// publishes it. This test holds that end.
func TestForeignWriterTrimGapForPeerStartedDuringOverlapHeals(t *testing.T) {
	for _, announce := range []bool{false, true} {
		t.Run(map[bool]string{false: "announcements-off", true: "announcements-on"}[announce], func(t *testing.T) {
			old, client, clk, _ := oldRotatorSecret(t, LayoutCertController)
			ctx := context.Background()
			adopting := func(c *Config) { c.Adopt, c.DisableReplicaAnnouncements = LayoutCertController, !announce }
			a := attackAuthority(t, client, clk, "late-peer-a", adopting)
			require.NoError(t, a.RunOnce(ctx))
			clk.Step(5 * time.Second)
			old.rewrite()
			o2 := old.latest
			b := attackAuthority(t, client, clk, "late-peer-b", adopting)
			require.NoError(t, b.RunOnce(ctx))
			require.NoError(t, b.Leaf().CheckSignatureFrom(o2.ca.Cert), "b signs with the CA it adopted")
			clk.Step(5 * time.Second)
			old.rewrite()
			require.NoError(t, a.RunOnce(ctx))
			require.NoError(t, b.RunOnce(ctx))
			require.NotEmpty(t, a.Status().ForeignWriter, "a holds")
			require.NotEmpty(t, b.Status().ForeignWriter, "b holds")
			require.NoError(t, b.Leaf().CheckSignatureFrom(o2.ca.Cert), "b serves its leaf of O2 during the hold")
			t.Logf("a's bundle during the hold holds O2: %v", caInBundle(t, a.CurrentCABundleContent(), o2.ca))

			for steps := 0; a.Status().ForeignWriter != ""; steps++ {
				require.Less(t, steps, 30, "a never adopted")
				clk.Step(time.Minute)
				require.NoError(t, a.RunOnce(ctx))
				if announce && steps%2 == 0 {
					require.NoError(t, b.RunOnce(ctx)) // b stays live (its Lease renewed), still holding
				}
			}
			require.NoError(t, a.RunOnce(ctx))
			t.Logf("after a's trim: ca.crt holds O2: %v (the gap)", caInBundle(t, getSecret(t, client).Data["ca.crt"], o2.ca))
			require.NoError(t, b.RunOnce(ctx))
			require.NoError(t, a.RunOnce(ctx))
			require.NoError(t, verifiesAt(t, b.Leaf(), getSecret(t, client).Data["ca.crt"], clk.Now()), "b's served leaf of O2 against ca.crt after b's next check")
			require.NoError(t, verifiesAt(t, b.Leaf(), a.CurrentCABundleContent(), clk.Now()), "b's served leaf of O2 against a's published bundle after its next check")
			require.NoError(t, verifiesAt(t, b.Leaf(), b.CurrentCABundleContent(), clk.Now()), "b's served leaf of O2 against its own published bundle")
		})
	}
}

// partitionedClient is a client for one replica that reaches the fake API
// server behind client until cut is set, and then fails every request as
// an unreachable server does (the replica keeps serving, renewing its leaf
// from the CA in memory: issuer.keepServing).
func partitionedClient(client *fake.Clientset, cut *atomic.Bool) *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("*", "*", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if cut.Load() {
			return true, nil, apierrors.NewServiceUnavailable("partitioned from the API server")
		}
		obj, err := client.Invokes(action, nil)
		return true, obj, err
	})
	c.PrependWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		if cut.Load() {
			return true, nil, apierrors.NewServiceUnavailable("partitioned from the API server")
		}
		w, err := client.InvokesWatch(action)
		return true, w, err
	})
	return c
}

// TestRetireKeepsCAOfPartitionedReplica (review42): b is cut off from the
// API server during the hold, before a's trim. It keeps serving, renewing
// its leaf from the CA it had in force (the old rotator's first CA, ca0)
// as the Authority does in an API outage; its Lease expires. The trim
// keeps ca0 (b's Lease announced a leaf of it) and records its retirement
// a leaf lifetime and a check interval later. Before the retirement
// (branch woldrot4 up to a274e05) ca0, valid for ten years, stayed, and
// b's clients kept trusting every leaf it renewed; a CA must not leave
// the bundle on a schedule while a replica that cannot read the Secret may
// still sign leaves with it.
func TestRetireKeepsCAOfPartitionedReplica(t *testing.T) {
	old, client, clk, ca0 := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	var cut atomic.Bool
	adopting := func(c *Config) { c.Adopt, c.DisableReplicaAnnouncements = LayoutCertController, false }
	b := attackAuthority(t, partitionedClient(client, &cut), clk, "partitioned-b", adopting)
	a := attackAuthority(t, client, clk, "partitioned-a", adopting)
	require.NoError(t, a.RunOnce(ctx)) // adopts ca0
	require.NoError(t, b.RunOnce(ctx))
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, b.Leaf().CheckSignatureFrom(ca0.ca.Cert), "b serves a leaf of ca0")
	clk.Step(5 * time.Second)
	old.rewrite()
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, b.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")
	require.NotEmpty(t, b.Status().ForeignWriter, "b holds")
	cut.Store(true)
	for steps := 0; a.Status().ForeignWriter != ""; steps++ {
		require.Less(t, steps, 30, "a never adopted")
		clk.Step(time.Minute)
		require.NoError(t, a.RunOnce(ctx))
		_ = b.RunOnce(ctx) // fails: partitioned
	}
	require.NoError(t, a.RunOnce(ctx))
	trimmed := clk.Now()
	s := getSecret(t, client)
	require.True(t, caInBundle(t, s.Data["ca.crt"], ca0.ca), "the trim keeps ca0, which b served a leaf of")
	t.Logf("retire-after: %q", s.Annotations[RetireAfterAnnotation])
	for steps := 0; steps < 150; steps++ {
		clk.Step(time.Minute)
		require.NoError(t, a.RunOnce(ctx))
		_ = b.RunOnce(ctx)
		require.NoError(t, b.Leaf().CheckSignatureFrom(ca0.ca.Cert), "b renews from ca0 in memory")
		require.NoError(t, verifiesAt(t, b.Leaf(), getSecret(t, client).Data["ca.crt"], clk.Now()),
			"b's leaf (renewed at %s) against ca.crt %v after the trim", b.Leaf().NotBefore, clk.Now().Sub(trimmed))
		require.NoError(t, verifiesAt(t, b.Leaf(), a.CurrentCABundleContent(), clk.Now()), "b's leaf against a's published bundle %v after the trim", clk.Now().Sub(trimmed))
	}
}

// TestForeignWriterTrimKeepsCAOfPartitionedReplica (review42): b is cut
// off from the API server before the overlap starts and keeps serving,
// renewing its leaf from the CA it had in force (ca0, adopted from the old
// rotator) as in any API outage; its Lease expires. The first episode
// ends in a's adoption of ca1 (ca0 stays: a's previous signing CA); the
// second, in ca2. The second trim leaves ca0 out at once (no live Lease
// announces a leaf of it), and b's clients fail: a trim must not take a
// replica whose Lease expired for one that serves nothing.
func TestForeignWriterTrimKeepsCAOfPartitionedReplica(t *testing.T) {
	old, client, clk, ca0 := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	var cut atomic.Bool
	adopting := func(c *Config) { c.Adopt, c.DisableReplicaAnnouncements = LayoutCertController, false }
	a := attackAuthority(t, client, clk, "partitioned-trim-a", adopting)
	b := attackAuthority(t, partitionedClient(client, &cut), clk, "partitioned-trim-b", adopting)
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, b.RunOnce(ctx))
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, b.Leaf().CheckSignatureFrom(ca0.ca.Cert), "b serves a leaf of ca0")
	cut.Store(true)
	episode := func(name string) {
		clk.Step(5 * time.Second)
		old.rewrite()
		require.NoError(t, a.RunOnce(ctx))
		require.NotEmpty(t, a.Status().ForeignWriter, "a holds in the %s episode", name)
		for steps := 0; a.Status().ForeignWriter != ""; steps++ {
			require.Less(t, steps, 30, "a never adopted in the %s episode", name)
			clk.Step(time.Minute)
			require.NoError(t, a.RunOnce(ctx))
			_ = b.RunOnce(ctx) // fails: partitioned
		}
		require.NoError(t, a.RunOnce(ctx))
		_ = b.RunOnce(ctx)
	}
	episode("first")
	require.NoError(t, verifiesAt(t, b.Leaf(), getSecret(t, client).Data["ca.crt"], clk.Now()), "b's leaf against ca.crt after the first trim")
	// a renews its leaf from ca1 (b, from ca0 in memory) before the old
	// rotator's next rewrite, which comes before ca0's retirement.
	for steps := 0; a.Leaf().CheckSignatureFrom(ca0.ca.Cert) == nil; steps++ {
		require.Less(t, steps, 50, "a never renewed its leaf")
		clk.Step(time.Minute)
		require.NoError(t, a.RunOnce(ctx))
		_ = b.RunOnce(ctx)
	}
	episode("second")
	t.Logf("after the second trim: ca.crt holds %d CAs; a's view of who serves ca0: %v; retire-after %q; b's leaf from %s", countCerts(t, getSecret(t, client).Data["ca.crt"]),
		a.issuer.servingFrom(ca0.ca.Cert), getSecret(t, client).Annotations[RetireAfterAnnotation], b.Leaf().Issuer.CommonName)
	require.NoError(t, b.Leaf().CheckSignatureFrom(ca0.ca.Cert), "b renews from ca0 in memory")
	require.NoError(t, verifiesAt(t, b.Leaf(), getSecret(t, client).Data["ca.crt"], clk.Now()), "b's leaf against ca.crt after the second trim")
}

// TestForeignWriterHoldsAfterHandledOperatorRequest (review42): an
// operator's request stays on the Secret once handled (the request and
// evercert.io/rotate-handled: never removed by the Authority), and the
// old rotator's Update keeps every annotation. A rotate-now asked during
// the overlap (an operator answering the Stalled status, say) must not
// turn the hold off for the rest of it: each later rewrite must be held,
// not adopted at once with a CA added to ca.crt each time (issue 27's
// 333 CAs).
func TestForeignWriterHoldsAfterHandledOperatorRequest(t *testing.T) {
	a, old, client, clk, _ := holdingReplica(t, "handled-request")
	ctx := context.Background()
	s := getSecret(t, client).DeepCopy()
	s.Annotations[RotateRequestedAnnotation] = clk.Now().UTC().Format(time.RFC3339)
	_, err := client.CoreV1().Secrets("ns").Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor(t, "the request handled", func() bool { return getSecret(t, client).Annotations[RotateHandledAnnotation] != "" })
	requireRewritesHeld(t, a, old, client, clk, "the handled request")
}

// TestForeignWriterHoldsAfterEmergencyDone (review42) is
// TestForeignWriterHoldsAfterHandledOperatorRequest for a compromised
// mark on the adopted CA before the overlap: once the emergency is over
// (the marked CA left the Secret:
// evercert.io/compromised-handled names it) the marks stay on the Secret,
// and the old rotator's later rewrites must be held again.
func TestForeignWriterHoldsAfterEmergencyDone(t *testing.T) {
	old, client, clk, _ := oldRotatorSecret(t, LayoutCertController)
	a := runAdopting(t, client, clk, "emergency-done", LayoutCertController, nil)
	ctx := context.Background()
	waitFor(t, "the adoption", func() bool {
		_, cc := getSecret(t, client).Data["ca.key"]
		return !cc && a.Leaf() != nil
	})
	a.mu.RLock()
	fp := Fingerprint(a.cas.signing.Cert)
	a.mu.RUnlock()
	s := getSecret(t, client).DeepCopy()
	s.Annotations[CompromisedCAAnnotation] = fp
	s.Annotations[CompromisedReasonAnnotation] = "review42"
	s.Annotations[CompromisedAtAnnotation] = clk.Now().UTC().Format(time.RFC3339)
	_, err := client.CoreV1().Secrets("ns").Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	for steps := 0; getSecret(t, client).Annotations[CompromisedHandledAnnotation] != fp; steps++ {
		require.Less(t, steps, 120, "the emergency never ended")
		clk.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	requireRewritesHeld(t, a, old, client, clk, "the emergency")
}

// requireRewritesHeld has the old rotator rewrite the Secret eight times,
// 20 s apart, while a runs, and requires that some of the rewrites were
// held and that ca.crt grew by one CA at most: no adoption per rewrite.
// after says what came before, for the failure message.
func requireRewritesHeld(t *testing.T, a *Authority, old *oldRotator, client *fake.Clientset, clk *clocktesting.FakeClock, after string) {
	t.Helper()
	start := countCerts(t, getSecret(t, client).Data["ca.crt"])
	held := 0
	for k := 1; k <= 8; k++ {
		clk.Step(20 * time.Second)
		old.rewrite()
		waitFor(t, "a check after the rewrite", func() bool {
			return a.Status().ForeignWriter != "" || caInBundle(t, getSecret(t, client).Data["ca.crt"], old.latest.ca) && string(getSecret(t, client).Data["tls.crt"]) != string(old.latest.leaf.CertPEM)
		})
		if a.Status().ForeignWriter != "" {
			held++
		}
	}
	end := countCerts(t, getSecret(t, client).Data["ca.crt"])
	require.Greater(t, held, 0, "none of 8 rewrites after %s was held; ca.crt went from %d to %d CAs", after, start, end)
	require.LessOrEqual(t, end, start+1, "ca.crt collects the old rotator's CAs")
}
