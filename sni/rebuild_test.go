package sni

import (
	"crypto/tls"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
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

	c := NewDynamicServingCertificateController(nil, clientCA, servingProvider, sniCerts, WithClock(clk))
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
	require.Same(t, want.def, got.def, "default")
	require.Equal(t, want.defaultIndex, got.defaultIndex)
	require.Equal(t, want.served.len(), got.served.len())
	for i := range want.served.len() {
		require.Same(t, want.served.at(i).desc, got.served.at(i).desc, "served %d", i)
		require.Equal(t, want.served.at(i).names, got.served.at(i).names, "served %d", i)
	}
	require.Equal(t, want.clientCAs, got.clientCAs)
	require.Same(t, want.config.ClientCAs, got.config.ClientCAs)
	require.Equal(t, want.config.ClientAuth, got.config.ClientAuth)
}

func requireSameEntries[K comparable](t *testing.T, want, got map[K]*tls.Certificate, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for k, cert := range want {
		require.Same(t, cert, got[k], "%s[%v]", what, k)
	}
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
	c := NewDynamicServingCertificateController(nil, nil, nil, sniCerts, WithClock(clk), WithResyncInterval(0))
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
