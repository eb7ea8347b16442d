package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestForeignWriterTrimKeepsPeersServingCA (review40b): a rolling update
// from cert-controller's pods; replica a adopts the first CA, the old
// rotator rewrites, replica b starts and adopts that second CA (its first
// read) and serves a leaf of it, the old rotator rewrites again and both
// hold. b is then slow (its checks stop: paused, cut off from the API)
// while it keeps serving; a adopts once the Secret is quiet and trims
// ca.crt. The trim must not drop the CA b's served leaf chains to: every
// client that takes the bundle then would fail b's handshakes with
// "x509: certificate signed by unknown authority".
func TestForeignWriterTrimKeepsPeersServingCA(t *testing.T) {
	old, client, clk, _ := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	adopting := func(c *Config) { c.Adopt = LayoutCertController }
	a := attackAuthority(t, client, clk, "trim-peer-a", adopting)
	require.NoError(t, a.RunOnce(ctx))
	clk.Step(5 * time.Second)
	old.rewrite()
	second := old.latest
	b := attackAuthority(t, client, clk, "trim-peer-b", adopting)
	require.NoError(t, b.RunOnce(ctx))
	require.NoError(t, b.Leaf().CheckSignatureFrom(second.ca.Cert), "b signs with the CA it adopted")
	require.NoError(t, a.RunOnce(ctx))
	clk.Step(5 * time.Second)
	old.rewrite()
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, b.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")
	t.Logf("a's bundle before the trim holds b's CA: %v", caInBundle(t, a.CurrentCABundleContent(), second.ca))

	// b stops checking; a adopts once the Secret is left alone.
	for steps := 0; a.Status().ForeignWriter != ""; steps++ {
		require.Less(t, steps, 30, "a never adopted")
		clk.Step(time.Minute)
		require.NoError(t, a.RunOnce(ctx))
	}
	require.NoError(t, a.RunOnce(ctx))
	trusted := getSecret(t, client).Data["ca.crt"]
	require.NoError(t, verifiesAt(t, b.Leaf(), trusted, clk.Now()), "b's served leaf against ca.crt after a's trim")
	require.NoError(t, verifiesAt(t, b.Leaf(), a.CurrentCABundleContent(), clk.Now()), "b's served leaf against a's published bundle after its trim")
}
