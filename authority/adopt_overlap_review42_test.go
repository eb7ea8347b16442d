package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestForeignWriterTrimKeepsCAOfPeerStartedDuringOverlap (review42): b
// starts while the old rotator still writes, adopts the old rotator's CA
// it reads first (its first read: O2) and writes it, and the old rotator
// rewrites (O3) before a ever reads b's write. a never had O2 in force,
// so neither its last state nor its episode memory holds it. When a
// adopts after the quiet period, every CA a served leaf chains to must
// stay in ca.crt: b serves a leaf of O2.
func TestForeignWriterTrimKeepsCAOfPeerStartedDuringOverlap(t *testing.T) {
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
			trusted := getSecret(t, client).Data["ca.crt"]
			published := a.CurrentCABundleContent()
			// What b's next check does about it (written back: the gap
			// lasts until b reads a's trim).
			require.NoError(t, b.RunOnce(ctx))
			require.NoError(t, a.RunOnce(ctx))
			t.Logf("after b's next check: ca.crt holds O2: %v, a's bundle holds O2: %v",
				caInBundle(t, getSecret(t, client).Data["ca.crt"], o2.ca), caInBundle(t, a.CurrentCABundleContent(), o2.ca))
			require.NoError(t, verifiesAt(t, b.Leaf(), trusted, clk.Now()), "b's served leaf of O2 against ca.crt after a's trim")
			require.NoError(t, verifiesAt(t, b.Leaf(), published, clk.Now()), "b's served leaf of O2 against a's published bundle after its trim")
		})
	}
}
