package sni

import (
	"crypto/tls"
	"fmt"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// TestRotationDerivesSnapshot rotates every kind of provider through Run
// (a new certificate with the same names, the provider notifying) and
// checks each new snapshot: it equals what a full build from the same slots
// gives (name index, default, served list, client CAs), it was derived
// from the previous one (an index map untouched by the rotation is the very
// same map), and the new certificate is served on the wire. A change of
// explicit names, which moves names between certificates, is built in full
// and then equals a full build too.
func TestRotationDerivesSnapshot(t *testing.T) {
	for _, withServing := range []bool{true, false} {
		name := "with serving certificate"
		if !withServing {
			name = "default from the first SNI certificate"
		}
		t.Run(name, func(t *testing.T) { testRotationDerivesSnapshot(t, withServing) })
	}
}

func testRotationDerivesSnapshot(t *testing.T, withServing bool) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "derive-ca")
	type provider struct {
		p     *mutableProvider
		cn    string
		dns   []string
		probe string      // a name it wins, to check on the wire; "" for none
		cur   *pki.Issued // what it serves now
	}
	providers := []*provider{
		{cn: "exact.example.com", dns: []string{"conflict.test"}, probe: "exact.example.com"},
		{cn: "wild_card", dns: []string{"*.wild.example.com"}, probe: "a.wild.example.com"},
		{cn: "conflict_loser", dns: []string{"conflict.test", "other.test"}, probe: "other.test"},
		{cn: "ip_holder", probe: "ip.test"},               // explicit names below
		{cn: "loser", dns: []string{"exact.example.com"}}, // every name taken earlier
	}
	explicit := map[int][]string{3: {"ip.test", "127.0.0.2"}}
	var sniCerts []dynamiccertificates.SNICertKeyContentProvider
	issue := func(pr *provider) *pki.Issued {
		pr.cur = issueLeaf(t, ca, leafSpec{cn: pr.cn, dns: pr.dns, now: clk.Now()})
		return pr.cur
	}
	for i, pr := range providers {
		pr.p = newMutable(t.Name()+"/"+pr.cn, issue(pr), explicit[i]...)
		sniCerts = append(sniCerts, pr.p)
	}
	internal := &provider{cn: "internal.test", dns: []string{"internal.test"}, probe: "internal.test"}
	internal.p = newMutable(t.Name()+"/internal", issue(internal), "internal.test")
	sniCerts = append(sniCerts, nameOnlyProvider{internal.p})
	providers = append(providers, internal)
	def := providers[0] // the first SNI certificate is the default...
	var servingProvider dynamiccertificates.CertKeyContentProvider
	if withServing {
		// ... unless there is a serving certificate.
		def = &provider{cn: "default.test", dns: []string{"default.test"}, probe: "unknown.test"}
		def.p = newMutable(t.Name()+"/serving", issue(def))
		servingProvider = def.p
		providers = append(providers, def)
	} else {
		def.probe = "unknown.test"
	}
	clientCAOne, clientCATwo := newTestCA(t, clk.Now(), "client-ca-1"), newTestCA(t, clk.Now(), "client-ca-2")
	clientCA := &mutableCA{name: t.Name() + "/client-ca", bundle: clientCAOne.CertPEM}

	c := newController(t, ControllerConfig{ClientCA: clientCA, Serving: servingProvider, SNI: sniCerts, Clock: clk})
	swapped := make(chanListener, 1)
	c.AddListener(swapped)
	runController(t, c)
	waitFor(t, swapped, "the first snapshot")
	srv := startServer(t, c.TLSConfig())
	requireFullBuild(t, c)

	for _, pr := range providers {
		prev := c.current.Load()
		next := issue(pr)
		pr.p.SetIssued(next)
		waitFor(t, swapped, "the swap after rotating "+pr.cn)
		cur := c.current.Load()
		requireFullBuild(t, c)
		assert.True(t, sharesIndex(prev, cur), "%s: the snapshot was derived, not rebuilt", pr.cn)
		if pr.probe != "" {
			requireSerial(t, next, servedSerial(t, srv.addr, clientConfig(clk, pr.probe)), pr.cn)
		}
	}

	// The client CA alone: a new config and CA list, the same index.
	prev := c.current.Load()
	clientCA.Set(clientCATwo.CertPEM)
	waitFor(t, swapped, "the swap after the client CA changed")
	requireFullBuild(t, c)
	assert.True(t, sharesIndex(prev, c.current.Load()))
	assert.Equal(t, clientCATwo.Cert.SerialNumber.Text(16), c.Served()[len(c.Served())-1].Serial)

	// New explicit names move ip.test away from the certificate: a full
	// build, which must reindex.
	ipHolder := providers[3]
	prev = c.current.Load()
	ipHolder.p.SetNames("ip2.test", "127.0.0.3")
	waitFor(t, swapped, "the swap after the names changed")
	requireFullBuild(t, c)
	assert.False(t, sharesIndex(prev, c.current.Load()), "new names rebuild the index")
	requireSerial(t, def.cur, servedSerial(t, srv.addr, clientConfig(clk, "ip.test")), "ip.test falls to the default now")

	// And a rotation after that is derived from the rebuilt index.
	prev = c.current.Load()
	next := issue(ipHolder)
	ipHolder.p.SetIssued(next)
	waitFor(t, swapped, "the swap after rotating under the new names")
	requireFullBuild(t, c)
	assert.True(t, sharesIndex(prev, c.current.Load()))
	requireSerial(t, next, servedSerial(t, srv.addr, clientConfig(clk, "ip2.test")))
	local := fakeConn{local: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3), Port: 443}}
	cert, err := c.GetCertificate(&tls.ClientHelloInfo{Conn: local})
	require.NoError(t, err)
	assert.Equal(t, next.Cert.Raw, cert.Leaf.Raw, "the explicit IP follows the rotation")
}

// requireFullBuild checks that the controller's current snapshot is what a
// full build from its slots gives.
func requireFullBuild(t *testing.T, c *DynamicServingCertificateController) {
	t.Helper()
	c.syncMu.Lock()
	want, err := buildSnapshot(snapshotInput{
		base: c.base, clientAuth: c.clientAuth, serving: c.serving, sni: c.sniSlots, clientCA: c.clientCA,
	})
	c.syncMu.Unlock()
	require.NoError(t, err)
	got := c.current.Load()
	requireSameEntries(t, want.exact, got.exact, "exact")
	requireSameEntries(t, want.wildcard, got.wildcard, "wildcard")
	requireSameEntries(t, want.ips, got.ips, "ips")
	requireSameChoice(t, want.def, got.def, "default")
	require.Equal(t, want.defaults, got.defaults, "defaults")
	require.Equal(t, want.served.len(), got.served.len())
	for i := range want.served.len() {
		require.Same(t, want.served.at(i).desc, got.served.at(i).desc, "served %d", i)
		require.Equal(t, want.served.at(i).names, got.served.at(i).names, "served %d", i)
	}
	require.Equal(t, want.clientCAs, got.clientCAs)
	require.Same(t, want.config.ClientCAs, got.config.ClientCAs)
	require.Equal(t, want.config.ClientAuth, got.config.ClientAuth)
}

func requireSameEntries[K comparable](t *testing.T, want, got map[K]*choice, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for k, ch := range want {
		requireSameChoice(t, ch, got[k], fmt.Sprintf("%s[%v]", what, k))
	}
}

// requireSameChoice checks that got selects from the same certificates as
// want, in the same order, with the same exclusivity: choices are compared
// by content, since a derived snapshot makes its own choices.
func requireSameChoice(t *testing.T, want, got *choice, what string) {
	t.Helper()
	require.NotNil(t, got, what)
	require.Len(t, got.certs, len(want.certs), what)
	for i, cert := range want.certs {
		require.Same(t, cert, got.certs[i], "%s: candidate %d", what, i)
	}
	require.Same(t, want.owner, got.owner, "%s: owner", what)
}

// sharesIndex reports whether cur shares an index map with prev, which only
// a derived snapshot does: a full build makes every map anew.
func sharesIndex(prev, cur *snapshot) bool {
	same := func(a, b any) bool {
		va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
		return !va.IsNil() && va.UnsafePointer() == vb.UnsafePointer()
	}
	return same(prev.exact, cur.exact) || same(prev.wildcard, cur.wildcard) || same(prev.ips, cur.ips)
}

// TestNotificationReadsOnlyThatProvider: through Run, a provider's
// notification makes the controller re-read that provider alone, which is
// what keeps a rotation among 100,000 providers cheap; Enqueue (the
// periodic resync's) re-reads them all, which also picks up a provider that
// changed without notifying.
func TestNotificationReadsOnlyThatProvider(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "reads-ca")
	var ps []*mutableProvider
	var sniCerts []dynamiccertificates.SNICertKeyContentProvider
	for _, n := range []string{"a", "b", "c"} {
		p := newMutable(t.Name()+"/"+n, issueLeaf(t, ca, leafSpec{cn: n + ".test", dns: []string{n + ".test"}, now: clk.Now()}))
		ps = append(ps, p)
		sniCerts = append(sniCerts, p)
	}
	c := newController(t, ControllerConfig{SNI: sniCerts, Clock: clk, ResyncInterval: -1})
	swapped := make(chanListener, 1)
	c.AddListener(swapped)
	runController(t, c)
	waitFor(t, swapped, "the first snapshot")
	reads := func() []int { return []int{ps[0].Reads(), ps[1].Reads(), ps[2].Reads()} }
	before := reads()

	next := issueLeaf(t, ca, leafSpec{cn: "b.test", dns: []string{"b.test"}, now: clk.Now()})
	ps[1].SetIssued(next)
	waitFor(t, swapped, "the swap after b rotated")
	assert.Equal(t, []int{before[0], before[1] + 1, before[2]}, reads(), "only b is read")
	srv := startServer(t, c.TLSConfig())
	requireSerial(t, next, servedSerial(t, srv.addr, clientConfig(clk, "b.test")))

	quiet := issueLeaf(t, ca, leafSpec{cn: "c.test", dns: []string{"c.test"}, now: clk.Now()})
	ps[2].setQuietly(quiet.CertPEM, quiet.KeyPEM)
	before = reads()
	c.Enqueue()
	waitFor(t, swapped, "the swap after the full re-read")
	assert.Equal(t, []int{before[0] + 1, before[1] + 1, before[2] + 1}, reads(), "Enqueue reads every provider")
	requireSerial(t, quiet, servedSerial(t, srv.addr, clientConfig(clk, "c.test")))
}

// TestDualRotationDerivesSnapshot: with certificates of two key algorithms
// for the same names, a rotation that keeps a certificate's names and key
// algorithm is derived (an index map is shared with the previous snapshot)
// and replaces only that candidate inside each choice that holds it, ECDSA
// first still: the snapshot equals a full build, choice by choice, and Go
// clients with and without ECDSA support get the rotated certificate of
// their algorithm on the wire. A rotation to another key algorithm moves
// the certificate within its choices, or out of them, and is built in full.
func TestDualRotationDerivesSnapshot(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "dual-derive-ca")
	type provider struct {
		p    *mutableProvider
		kt   pki.KeyType
		dns  []string
		cur  *pki.Issued
		name string
	}
	issue := func(pr *provider) *pki.Issued {
		pr.cur = issueLeaf(t, ca, leafSpec{cn: pr.name, dns: pr.dns, ips: []net.IP{net.IPv4(127, 0, 0, 1)}, now: clk.Now(), keyType: pr.kt})
		return pr.cur
	}
	all := map[string]*provider{}
	add := func(name string, kt pki.KeyType, dns []string, explicit ...string) *provider {
		pr := &provider{kt: kt, dns: dns, name: name}
		pr.p = newMutable(t.Name()+"/"+name, issue(pr), explicit...)
		all[name] = pr
		return pr
	}
	serving := add("default-e", pki.ECDSAP256, []string{"default.test"})
	var sniCerts []dynamiccertificates.SNICertKeyContentProvider
	order := []string{"default-r", "dual-r", "dual-e", "order-r", "order-e", "same-1", "same-2", "ip-e", "ip-r"}
	add("default-r", pki.RSA2048, []string{"default.test"})
	add("dual-r", pki.RSA2048, []string{"dual.test", "*.wild.test"})
	add("dual-e", pki.ECDSAP256, []string{"dual.test", "*.wild.test"})
	add("order-r", pki.RSA2048, []string{"order.test"})
	add("order-e", pki.ECDSAP256, []string{"order.test"})
	add("same-1", pki.ECDSAP256, []string{"same.test"})
	add("same-2", pki.ECDSAP384, []string{"same.test"})
	add("ip-e", pki.ECDSAP256, []string{"ip-e.test"}, "ip.test", "127.0.0.2")
	add("ip-r", pki.RSA2048, []string{"ip-r.test"}, "ip.test", "127.0.0.2")
	for _, name := range order {
		sniCerts = append(sniCerts, all[name].p)
	}
	internal := add("internal", pki.ECDSAP256, []string{"internal.test"}, "internal.test")
	sniCerts = append(sniCerts, nameOnlyProvider{internal.p})
	order = append([]string{"default-e"}, append(order, "internal")...)

	c := newController(t, ControllerConfig{Serving: serving.p, SNI: sniCerts, Clock: clk})
	swapped := make(chanListener, 1)
	c.AddListener(swapped)
	runController(t, c)
	waitFor(t, swapped, "the first snapshot")
	srv := startServer(t, c.TLSConfig())
	requireFullBuild(t, c)

	// What each server name selects: the ECDSA and the RSA candidate ("" for
	// none: an RSA-only client then gets the ECDSA one and fails).
	probes := []struct{ serverName, ecdsa, rsa string }{
		{"", "default-e", "default-r"},
		{"default.test", "default-e", "default-r"},
		{"nomatch.test", "default-e", "default-r"},
		{"dual.test", "dual-e", "dual-r"},
		{"a.wild.test", "dual-e", "dual-r"},
		{"order.test", "order-e", "order-r"},
		{"same.test", "same-1", ""},
		{"ip.test", "ip-e", "ip-r"},
		{"internal.test", "internal", ""},
	}
	checkWire := func(after string) {
		t.Helper()
		for _, pb := range probes {
			requireSerial(t, all[pb.ecdsa].cur, servedSerial(t, srv.addr, clientConfig(clk, pb.serverName)),
				"%s: ECDSA client, %q", after, pb.serverName)
			if pb.rsa != "" {
				got, err := tlstest.Handshake(srv.addr, rsaOnlyTLS12(clientConfig(clk, pb.serverName)))
				require.NoError(t, err, "%s: RSA client, %q", after, pb.serverName)
				requireSerial(t, all[pb.rsa].cur, got.SerialNumber, "%s: RSA client, %q", after, pb.serverName)
			}
		}
		local := fakeConn{local: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 443}}
		ch := c.current.Load().choose(&tls.ClientHelloInfo{Conn: local})
		require.Len(t, ch.certs, 2, after)
		assert.Equal(t, all["ip-e"].cur.Cert.Raw, ch.certs[0].Leaf.Raw, "%s: the explicit IP, ECDSA first", after)
		assert.Equal(t, all["ip-r"].cur.Cert.Raw, ch.certs[1].Leaf.Raw, "%s: the explicit IP, RSA second", after)
	}
	checkWire("the first snapshot")

	for _, name := range order {
		pr := all[name]
		prev := c.current.Load()
		pr.p.SetIssued(issue(pr))
		waitFor(t, swapped, "the swap after rotating "+name)
		requireFullBuild(t, c)
		assert.True(t, sharesIndex(prev, c.current.Load()), "%s: the snapshot was derived, not rebuilt", name)
		checkWire("after rotating " + name)
	}

	// dual-r turns ECDSA: the earlier ECDSA certificate of dual.test, dual-r
	// itself now, wins, and dual-e (and RSA) are out. A full build.
	dualR := all["dual-r"]
	dualR.kt = pki.ECDSAP256
	prev := c.current.Load()
	dualR.p.SetIssued(issue(dualR))
	waitFor(t, swapped, "the swap after dual-r turned ECDSA")
	requireFullBuild(t, c)
	assert.False(t, sharesIndex(prev, c.current.Load()), "a new key algorithm rebuilds the index")
	requireSerial(t, dualR.cur, servedSerial(t, srv.addr, clientConfig(clk, "dual.test")))
	assert.Len(t, c.current.Load().exact["dual.test"].certs, 1)

	// And back to RSA: a full build again, then derived rotations as before.
	dualR.kt = pki.RSA2048
	prev = c.current.Load()
	dualR.p.SetIssued(issue(dualR))
	waitFor(t, swapped, "the swap after dual-r turned RSA again")
	requireFullBuild(t, c)
	assert.False(t, sharesIndex(prev, c.current.Load()))
	checkWire("after dual-r turned RSA again")
	for _, name := range []string{"dual-r", "default-e"} {
		prev := c.current.Load()
		all[name].p.SetIssued(issue(all[name]))
		waitFor(t, swapped, "the swap after rotating "+name+" again")
		requireFullBuild(t, c)
		assert.True(t, sharesIndex(prev, c.current.Load()), name)
		checkWire("after rotating " + name + " again")
	}
}
