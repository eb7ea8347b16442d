package authority

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/backoff"
)

// TestAdoptOnOwnLayoutIsNoop: Adopt left set after the switch (or set on
// a Secret already in the Authority's layout) changes nothing: a replica
// adopting with any layout reads the Authority's Secret as its own, signs
// with its CA and writes nothing.
func TestAdoptOnOwnLayoutIsNoop(t *testing.T) {
	for _, layout := range []SecretLayout{LayoutCertController, LayoutCertManager, LayoutKnative} {
		t.Run(string(layout), func(t *testing.T) {
			client := fake.NewClientset()
			optimistic(client)
			// Reactors go in before any Run loop calls the client: the
			// fake's reactor chain is not safe to change concurrently.
			writes := secretWrites(client)
			clk := clocktesting.NewFakeClock(testNow)
			own := runAdopting(t, client, clk, "own-"+string(layout), LayoutEvercert, nil)
			waitFor(t, "the Authority's own Secret", func() bool { return own.Leaf() != nil })
			waitWaiters(t, clk, 1)
			before := getSecret(t, client)
			ownWrites := writes.Load()

			a := runAdopting(t, client, clk, "adopting-"+string(layout), layout, nil)
			waitFor(t, "the adopting replica's leaf", func() bool { return a.Leaf() != nil || a.LastError() != nil })
			require.NoError(t, a.LastError())
			waitWaiters(t, clk, 2)
			assert.Equal(t, ownWrites, writes.Load(), "nothing to adopt, nothing written")
			assert.Equal(t, before.ResourceVersion, getSecret(t, client).ResourceVersion)
			// own's loop may be checking meanwhile (the adopting replica's
			// Lease kicks it): read its CA under its lock.
			own.mu.RLock()
			ownCA := own.cas.signing.Cert
			own.mu.RUnlock()
			require.NoError(t, a.Leaf().CheckSignatureFrom(ownCA), "the Authority's CA signs")
			require.NoError(t, handshakeWith(t, a, before.Data["ca.crt"], clk.Now))
		})
	}
}

// TestAdoptRollingUpgrade: a rolling upgrade that turns Adopt on runs old
// replicas (no Adopt) beside new ones (Adopt set) on the other tool's
// Secret. The old ones refuse the foreign layout (they never take it for
// an empty Secret and make a CA nobody trusts) and keep what they serve;
// once the Secret is converted every replica signs with the adopted CA,
// without a write ping-pong.
func TestAdoptRollingUpgrade(t *testing.T) {
	f := newForeignCA(t, "cert-controller-ca")
	client := fake.NewClientset(opaqueSecret(f.certController()))
	optimistic(client)
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	old := runAdopting(t, client, clk, "rolling-old", LayoutEvercert, nil)
	waitFor(t, "the old replica's refusal", func() bool { return old.LastError() != nil })
	assert.ErrorContains(t, old.LastError(), `set AuthorityConfig.Adopt to "cert-controller"`)
	assert.Zero(t, writes.Load())
	assert.Nil(t, old.Leaf())

	adopting := runAdopting(t, client, clk, "rolling-new", LayoutCertController, nil)
	waitFor(t, "the new replica's leaf", func() bool { return adopting.Leaf() != nil })
	// The old replica retries with backoff on the fake clock; step it on.
	ok := func() bool { return old.Leaf() != nil && old.LastError() == nil }
	for steps := 0; !ok(); steps++ {
		require.Less(t, steps, 100, "the old replica never signs with the adopted CA")
		clk.Step(2 * backoff.DefaultCap)
		waitFor(t, "a check", func() bool { return clk.Waiters() >= 2 || ok() })
	}
	settle(t, clk, 2, client, writes, 2, old, adopting)
	for _, r := range []*Authority{old, adopting} {
		require.NoError(t, r.Leaf().CheckSignatureFrom(f.ca.Cert), "%s signs with the adopted CA", r.Name())
		require.NoError(t, handshakeWith(t, r, f.ca.CertPEM, clk.Now), "a client holding cert-controller's caBundle verifies %s", r.Name())
	}
}
