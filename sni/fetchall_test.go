package sni

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/klogtest"
	"github.com/evercert/evercert/internal/pki"
)

// TestFirstSyncParsesOnSeveralWorkers: the first sync parses the providers
// on more than one goroutine. Each parse waits, through the parse hook,
// until another parse is under way at the same time; a sequential sync
// never gets there (each wait then gives up after a while, so the test
// ends), a parallel one does at once.
func TestFirstSyncParsesOnSeveralWorkers(t *testing.T) {
	klogtest.Discard(t)
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	var providers []dynamiccertificates.SNICertKeyContentProvider
	for i := range 8 {
		name := fmt.Sprintf("p%d.test", i)
		providers = append(providers, newMutable(name, issueLeaf(t, ca, leafSpec{cn: name, now: clk.Now()})))
	}
	c := newController(t, ControllerConfig{SNI: providers, Clock: clk})
	c.parseWorkers = 4

	var (
		inFlight, most atomic.Int32
		parses         atomic.Int32
		together       = make(chan struct{})
		once           sync.Once
	)
	c.onParse = func(string) {
		parses.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n >= 2 {
			once.Do(func() { close(together) })
		}
		select {
		case <-together:
		case <-time.After(5 * time.Second):
			once.Do(func() { close(together) }) // sequential: stop waiting
		}
	}

	require.NoError(t, c.RunOnce(context.Background()))
	assert.EqualValues(t, 8, parses.Load(), "each provider parsed once")
	assert.GreaterOrEqual(t, most.Load(), int32(2), "parses under way at the same time")
	for i := range 8 {
		name := fmt.Sprintf("p%d.test", i)
		cert, err := c.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
		require.NoError(t, err, name)
		assert.Equal(t, name, cert.Leaf.Subject.CommonName)
	}
}

// TestParallelSyncEqualsSequential: a first sync on several workers builds
// the snapshot a sequential one builds, with the same precedence among
// providers claiming the same name, and reports each rejected provider
// once, in the same order; later syncs after one provider notified are
// unchanged.
func TestParallelSyncEqualsSequential(t *testing.T) {
	logs := klogtest.Capture(t)
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	rsaCA := newTestCA(t, clk.Now(), "ca")
	type spec struct {
		name string
		iss  *pki.Issued
		sni  []string
	}
	var specs []spec
	for i := range 200 {
		name := fmt.Sprintf("host-%d.test", i%150) // 50 names claimed twice: the earlier wins
		s := spec{name: fmt.Sprintf("p%d", i), iss: issueLeaf(t, ca, leafSpec{cn: name, now: clk.Now()})}
		switch {
		case i%37 == 5:
			s.iss = &pki.Issued{CertPEM: []byte("not PEM"), KeyPEM: s.iss.KeyPEM}
		case i%41 == 7:
			s.iss = issueLeaf(t, ca, leafSpec{cn: name, now: clk.Now().Add(time.Hour)}) // not yet valid
		case i%29 == 3:
			s.iss = issueLeaf(t, rsaCA, leafSpec{cn: name, now: clk.Now(), keyType: pki.RSA2048}) // joins the ECDSA one
		case i%23 == 1:
			s.sni = []string{"*.wild.test", name}
		}
		specs = append(specs, s)
	}

	type result struct {
		err      error
		served   []ServedCertificate
		selected []string
		rejected [][]string
	}
	run := func(prefix string, workers int) result {
		var providers []dynamiccertificates.SNICertKeyContentProvider
		for _, s := range specs {
			providers = append(providers, newMutable(prefix+s.name, s.iss, s.sni...))
		}
		c := newController(t, ControllerConfig{SNI: providers, Clock: clk})
		c.parseWorkers = workers
		var r result
		r.err = c.RunOnce(context.Background())
		for _, sc := range c.Served() {
			sc.Provider = sc.Provider[len(prefix):]
			r.served = append(r.served, sc)
		}
		for i := range 150 {
			for _, hello := range []*tls.ClientHelloInfo{
				{ServerName: fmt.Sprintf("host-%d.test", i)},
				{ServerName: fmt.Sprintf("host-%d.test", i), SignatureSchemes: []tls.SignatureScheme{tls.PSSWithSHA256}, SupportedVersions: []uint16{tls.VersionTLS12}, CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}},
				{ServerName: fmt.Sprintf("x%d.wild.test", i)},
			} {
				cert, err := c.GetCertificate(hello)
				require.NoError(t, err)
				r.selected = append(r.selected, cert.Leaf.SerialNumber.String())
			}
		}
		for _, s := range specs {
			r.rejected = append(r.rejected, logs.Lines("Rejected new content", "provider="+prefix+s.name+" "))
		}
		return r
	}
	seq, par := run("seq-", 1), run("par-", 4)
	require.NoError(t, seq.err)
	require.NoError(t, par.err)
	assert.Equal(t, seq.served, par.served)
	assert.Equal(t, seq.selected, par.selected)
	bad := 0
	for i := range specs {
		assert.Len(t, seq.rejected[i], len(par.rejected[i]), specs[i].name)
		if len(seq.rejected[i]) > 0 {
			bad++
			assert.Len(t, par.rejected[i], 1, "%s reported once", specs[i].name)
		}
	}
	assert.Positive(t, bad, "some providers were rejected")
	// The rejections come in provider order in both.
	order := func(prefix string) []string {
		var out []string
		for _, line := range logs.Lines("Rejected new content", "provider="+prefix) {
			_, rest, _ := strings.Cut(line, "provider="+prefix)
			name, _, _ := strings.Cut(rest, " ")
			out = append(out, name)
		}
		return out
	}
	assert.Equal(t, order("seq-"), order("par-"))
	assert.Len(t, order("par-"), bad)
}
