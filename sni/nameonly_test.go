package sni

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"
)

// nameOnlyProvider is a mutableProvider that asks to be served for its
// explicit names only, as the loopback certificate does.
type nameOnlyProvider struct{ *mutableProvider }

func (nameOnlyProvider) NameOnly() bool { return true }

// TestNameOnlyNeverDefault is the library half of the field-trial defect
// "the loopback identity is served as the default": with no serving
// certificate and an internal identity listed first, a client that sends no
// SNI, an unknown name or an IP must get the user's certificate, and only a
// client asking for the internal name gets the internal one, whatever the
// order and even when a user certificate claims the same name.
func TestNameOnlyNeverDefault(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "name-only-ca")
	internal := issueLeaf(t, ca, leafSpec{cn: "apiserver-loopback-client", dns: []string{"apiserver-loopback-client"}, now: clk.Now()})
	user := issueLeaf(t, ca, leafSpec{cn: "user.test", dns: []string{"user.test"}, now: clk.Now()})
	squatter := issueLeaf(t, ca, leafSpec{cn: "squatter", dns: []string{"squatter.test"}, now: clk.Now()})

	for _, order := range []string{"internal first", "internal last"} {
		t.Run(order, func(t *testing.T) {
			loop := nameOnlyProvider{newMutable("loopback", internal, "apiserver-loopback-client", "127.0.0.1")}
			users := []dynamiccertificates.SNICertKeyContentProvider{
				// Claims the internal name explicitly: must still lose it.
				newMutable("squatter", squatter, "apiserver-loopback-client", "squatter.test"),
				newMutable("user", user),
			}
			var sniCerts []dynamiccertificates.SNICertKeyContentProvider
			if order == "internal first" {
				sniCerts = append([]dynamiccertificates.SNICertKeyContentProvider{loop}, users[1], users[0])
			} else {
				sniCerts = append(users[1:2:2], users[0], loop)
			}
			c := newController(t, ControllerConfig{SNI: sniCerts, Clock: clk})
			require.NoError(t, c.RunOnce(context.Background()))
			srv := startServer(t, c.TLSConfig())

			requireSerial(t, user, servedSerial(t, srv.addr, clientConfig(clk, "")), "no SNI gets the user's first certificate")
			requireSerial(t, user, servedSerial(t, srv.addr, clientConfig(clk, "unknown.test")), "an unknown name gets the user's first certificate")
			requireSerial(t, internal, servedSerial(t, srv.addr, clientConfig(clk, "apiserver-loopback-client")), "the internal name gets the internal identity")
			requireSerial(t, squatter, servedSerial(t, srv.addr, clientConfig(clk, "squatter.test")))

			// A hello with no SNI on 127.0.0.1, which the name-only
			// provider listed as a name: IPs are ignored for it.
			got, err := c.GetCertificate(&tls.ClientHelloInfo{Conn: fakeConn{local: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443}}})
			require.NoError(t, err)
			require.Equal(t, user.Cert.Raw, got.Leaf.Raw, "a local IP never selects the name-only certificate")

			for _, sc := range c.Served() {
				if sc.Provider == "loopback" {
					require.False(t, sc.IsDefault)
					require.Equal(t, []string{"apiserver-loopback-client"}, sc.Names)
				}
			}
		})
	}
}

// TestNameOnlyAloneIsNotServed: when only the internal identity has valid
// content, the controller does not become ready; it never falls back to it.
func TestNameOnlyAloneIsNotServed(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "name-only-ca")
	internal := issueLeaf(t, ca, leafSpec{cn: "apiserver-loopback-client", dns: []string{"apiserver-loopback-client"}, now: clk.Now()})
	c := newController(t, ControllerConfig{
		SNI: []dynamiccertificates.SNICertKeyContentProvider{
			nameOnlyProvider{newMutable("loopback", internal, "apiserver-loopback-client")},
			newMutable("user-not-loaded-yet", nil),
		},
		Clock: clk,
	})
	require.ErrorIs(t, c.RunOnce(context.Background()), errNothingLoaded)
	require.False(t, c.HasSynced())
}
