package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestForeignWriterRestartedPeerKeepsHoldingPeersCA (simulator, adoption
// plans: seeds 466, 1049 and most S1 findings left once the old tool's own
// caBundle injection is modelled; open): a adopts the old rotator's CA O1
// and serves a leaf of it; the old rotator answers with O2 and its pods go
// away (the rolling update is over), a holding. b starts then (a restart,
// a rollout's next pod) and reads O2 as its first state: it adopts it
// alone, writes ca.crt with O2 only and publishes that, although a's Lease
// announces a leaf of O1. No old tool writes the caBundle any more, so
// a's clients fail (x509: certificate signed by unknown authority) until
// a reads b's write (a peer's: its hold ends), writes O1 back, and b reads
// that: a watch delivery and a check or two here. While the old pods still
// run, their answer to b's write can come first, and the gap lasts until
// a's adoption at the end of its quiet period (docs/migrating.md). The
// simulator's S1 found it after the old pods stopped (caBundle) and during
// the overlap (the ClusterTrustBundle, which no old tool writes). b cannot
// put O1 back itself: a Lease names a's CA by fingerprint, and the old
// rotator's rewrite replaced every key of the Secret that held it.
func TestForeignWriterRestartedPeerKeepsHoldingPeersCA(t *testing.T) {
	old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	adopting := func(c *Config) { c.Adopt = LayoutCertController }
	a := attackAuthority(t, client, clk, "holding-a", adopting)
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, a.Leaf().CheckSignatureFrom(o1.ca.Cert), "a signs with the CA it adopted")
	clk.Step(5 * time.Second)
	old.rewrite() // its answer to the adoption; then its pods are gone
	require.NoError(t, a.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")
	require.NoError(t, a.Leaf().CheckSignatureFrom(o1.ca.Cert), "a serves its leaf of O1 during the hold")

	clk.Step(10 * time.Second)
	b := attackAuthority(t, client, clk, "restarted-b", adopting)
	require.NoError(t, b.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a has not read b's write yet: it holds")
	require.NoError(t, verifiesAt(t, a.Leaf(), b.CurrentCABundleContent(), clk.Now()), "a's served leaf of O1 against the bundle b publishes")
	require.NoError(t, verifiesAt(t, a.Leaf(), getSecret(t, client).Data["ca.crt"], clk.Now()), "a's served leaf of O1 against ca.crt")
}
