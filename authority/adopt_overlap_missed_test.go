package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
