package authority

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clienttesting "k8s.io/client-go/testing"
)

// TestForeignWriterHoldKeepsCAPeerAdoptedUnread (the simulator, seeds
// 1397, 1801 and 1893, S2): a and b hold on the old rotator's rewrite (O2);
// b adopts it once the Secret has been left alone for the quiet period (the
// trim), and the old rotator answers that adoption with another rewrite
// (O3) before a read b's write (a's reads of the Secret failed or were slow
// meanwhile). a's hold served its state in force and the old rotator's
// current CA only, O3: O2, which b signs with, left a's bundle, and so the
// caBundle target and the ClusterTrustBundle a publishes, while a's Lease
// still announced it. The Secret as a reads it names O2 (WrittenCAAnnotation
// and the record of the bundle b wrote, WrittenBundleAnnotation): a's hold
// serves it.
func TestForeignWriterHoldKeepsCAPeerAdoptedUnread(t *testing.T) {
	old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	adopting := func(c *Config) { c.Adopt = LayoutCertController }
	a := attackAuthority(t, client, clk, "holding-a", adopting)
	b := attackAuthority(t, client, clk, "adopting-b", adopting)
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, b.RunOnce(ctx))
	require.NoError(t, a.Leaf().CheckSignatureFrom(o1.ca.Cert), "a signs with the CA it adopted")

	clk.Step(5 * time.Second)
	old.rewrite()
	o2 := old.latest
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, b.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")
	require.NotEmpty(t, b.Status().ForeignWriter, "b holds")
	require.True(t, caInBundle(t, a.CurrentCABundleContent(), o2.ca), "a's hold serves the old rotator's current CA")

	// The Secret is left alone: b adopts O2, and a does not read it yet.
	for steps := 0; ; steps++ {
		require.Less(t, steps, 120, "b did not adopt O2 within twenty minutes")
		clk.Step(10 * time.Second)
		require.NoError(t, b.RunOnce(ctx))
		if b.Status().ForeignWriter == "" {
			break
		}
	}
	require.Equal(t, Fingerprint(o2.ca.Cert), b.Status().Signing.Fingerprint, "b adopted O2")
	require.Equal(t, Fingerprint(o2.ca.Cert), getSecret(t, client).Annotations[WrittenCAAnnotation], "b's write names the CA it signs with")

	clk.Step(5 * time.Second)
	old.rewrite() // its answer to b's adoption
	require.NoError(t, a.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds on O3, never having read b's adoption")
	require.True(t, caInBundle(t, a.CurrentCABundleContent(), old.latest.ca), "a's hold serves the old rotator's current CA, O3")
	require.True(t, caInBundle(t, a.CurrentCABundleContent(), o2.ca), "a's hold serves O2, which b signs with")
	require.NoError(t, a.Leaf().CheckSignatureFrom(o1.ca.Cert), "a serves its leaf of O1 during the hold")
}

// TestForeignWriterStalledUntilAdoptionWritten (the simulator, seed 1434,
// V1): a holds on the old rotator's rewrites, its state in force differing
// from the Secret's all along and Status saying so (Stalled,
// ForeignWriter). Once the Secret has been left alone for the quiet
// period, a adopts it, but every write conflicts (another writer keeps
// updating the Secret's metadata). A conflict streak is reported only once
// it outlasts a check interval, and the reason was cleared as soon as the
// quiet period was over: a, diverged for the whole hold, said nothing
// meanwhile. It says Stalled until the adoption is written.
func TestForeignWriterStalledUntilAdoptionWritten(t *testing.T) {
	old, client, clk, _ := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	a := attackAuthority(t, client, clk, "holding-a", func(c *Config) { c.Adopt = LayoutCertController })
	require.NoError(t, a.RunOnce(ctx))
	clk.Step(5 * time.Second)
	old.rewrite()
	require.NoError(t, a.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")

	var conflicts atomic.Bool
	client.PrependReactor("update", "secrets", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if !conflicts.Load() {
			return false, nil, nil
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, "ca", fmt.Errorf("simulated: another writer updated it first"))
	})
	conflicts.Store(true)
	for steps := 0; ; steps++ {
		require.Less(t, steps, 120, "a did not try to adopt the rewrite within twenty minutes")
		clk.Step(10 * time.Second)
		err := a.RunOnce(ctx)
		if err == nil {
			require.NotEmpty(t, a.Status().ForeignWriter, "a holds until the quiet period is over")
			continue
		}
		require.True(t, apierrors.IsConflict(err), "the adoption's write conflicts: %v", err)
		break
	}
	st := a.Status()
	require.Nil(t, st.LastError, "a conflict streak shorter than a check interval is not a failed check")
	require.True(t, st.Stalled, "a's state in force is not the Secret's and its adoption is not written: Status says so")
	require.NotEmpty(t, st.ForeignWriter, "the reason names the adoption that is not written yet")

	conflicts.Store(false)
	require.NoError(t, a.RunOnce(ctx))
	st = a.Status()
	require.Empty(t, st.ForeignWriter, "the adoption is written")
	require.False(t, st.Stalled)
	require.Equal(t, Fingerprint(old.latest.ca.Cert), st.Signing.Fingerprint, "a adopted the rewrite")
}

// TestForeignWriterRestartedPeerTrustsRecordedSigningCA (the simulator,
// seed 129, S1): a adopts the old rotator's rewrite (O2) at the end of a
// hold and signs with it; the old rotator answers with another rewrite
// (O3); b, a rolling update's next pod, starts on that rewrite. b trusted
// only the recorded CAs a peer's Lease announces a leaf of, and a announced
// none of O2 yet (its leaf was still O1's, or its Lease not renewed since):
// b published a bundle without the CA a signs with, and a's next leaf
// failed b's clients, and those of the caBundle target b publishes. The CA
// the Authority's last write signed with (WrittenCAAnnotation) is trusted
// as a served one is.
func TestForeignWriterRestartedPeerTrustsRecordedSigningCA(t *testing.T) {
	old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	announced := func(c *Config) { c.Adopt, c.DisableReplicaAnnouncements = LayoutCertController, false }
	a := attackAuthority(t, client, clk, "adopting-a", announced)
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, a.Leaf().CheckSignatureFrom(o1.ca.Cert), "a signs with the CA it adopted")
	clk.Step(5 * time.Second)
	old.rewrite()
	o2 := old.latest
	require.NoError(t, a.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")
	for steps := 0; a.Status().ForeignWriter != ""; steps++ {
		require.Less(t, steps, 120, "a did not adopt O2 within twenty minutes")
		clk.Step(10 * time.Second)
		require.NoError(t, a.RunOnce(ctx))
	}
	require.Equal(t, Fingerprint(o2.ca.Cert), a.Status().Signing.Fingerprint, "a adopted O2")

	clk.Step(5 * time.Second)
	old.rewrite() // its answer to a's adoption
	b := attackAuthority(t, client, clk, "restarted-b", announced)
	require.NoError(t, b.RunOnce(ctx))
	require.True(t, caInBundle(t, b.CurrentCABundleContent(), old.latest.ca), "b adopted the rewrite it read first")
	require.True(t, caInBundle(t, b.CurrentCABundleContent(), o2.ca), "b's bundle holds O2, which a signs with")
	require.True(t, caInBundle(t, getSecret(t, client).Data["ca.crt"], o2.ca), "the ca.crt b wrote holds O2")
}
