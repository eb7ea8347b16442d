package sni

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// nameOnlyWithAlternatives is a name-only provider with an alternative of
// another key algorithm, as a name-only wrapper around a dual-key
// authority.SelfSigned would be.
type nameOnlyWithAlternatives struct {
	*mutableProvider
	alts []dynamiccertificates.SNICertKeyContentProvider
}

func (nameOnlyWithAlternatives) NameOnly() bool { return true }

func (p nameOnlyWithAlternatives) Alternatives() []dynamiccertificates.SNICertKeyContentProvider {
	return p.alts
}

// TestNameOnlyAlternativeIsServed: a name-only provider's own alternative
// is served for the provider's names to clients that cannot use the
// primary certificate, while it stays name-only (never the default, never
// joined by other providers). Before the fix the name-only choice refused
// its own alternative, so an RSA-only client failed the handshake.
func TestNameOnlyAlternativeIsServed(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "nameonly-alt-ca")
	leaf := func(kt pki.KeyType, cn string) *pki.Issued {
		return issueLeaf(t, ca, leafSpec{cn: cn, dns: []string{cn}, ips: []net.IP{net.IPv4(127, 0, 0, 1)}, now: clk.Now(), keyType: kt})
	}
	def := leaf(pki.ECDSAP256, "default.test")
	intE, intR := leaf(pki.ECDSAP256, "internal.test"), leaf(pki.RSA2048, "internal.test")
	other := leaf(pki.RSA2048, "internal.test")
	internal := nameOnlyWithAlternatives{
		mutableProvider: newMutable("internal", intE, "internal.test"),
		alts:            []dynamiccertificates.SNICertKeyContentProvider{newMutable("internal/rsa", intR, "internal.test")},
	}
	c := newController(t, ControllerConfig{
		Serving: newMutable("default", def),
		// other claims the name with RSA before the name-only provider's
		// alternative would: the name stays the name-only provider's.
		SNI:   []dynamiccertificates.SNICertKeyContentProvider{newMutable("other", other), internal},
		Clock: clk,
	})
	runController(t, c)
	require.Eventually(t, c.HasSynced, 30*time.Second, 5*time.Millisecond)
	addr := startServer(t, c.TLSConfig()).addr

	for _, client := range allDualClients {
		want := intE
		if client.wantsRSA() {
			want = intR
		}
		served, err := handshakeAs(t, client, addr, clientConfig(clk, "internal.test"))
		require.NoError(t, err, "%s: the name-only provider's alternative serves clients without ECDSA", client)
		assert.Equal(t, want.Cert.SerialNumber, served.SerialNumber, "%s: want %s", client, want.Cert.Subject.CommonName)

		// Without SNI the default is served, never the internal identity.
		served, err = handshakeAs(t, client, addr, clientConfig(clk, ""))
		if client.wantsRSA() {
			require.Error(t, err, "%s: no RSA default", client)
			continue
		}
		require.NoError(t, err, client)
		assert.Equal(t, def.Cert.SerialNumber, served.SerialNumber, client)
	}

	served := map[string]ServedCertificate{}
	for _, sc := range c.Served() {
		served[sc.Provider] = sc
	}
	assert.Equal(t, []string{"internal.test"}, served["internal/rsa"].Names)
	assert.False(t, served["internal/rsa"].IsDefault)
	assert.Empty(t, served["other"].Names, "a name-only provider's names take no other provider")
}
