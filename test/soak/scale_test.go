//go:build soak

package soak

import (
	"crypto/x509"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scaleReplicas is the number of replicas of the scale scenario.
var scaleReplicas = flag.Int("soak.scale-replicas", 100, "replicas of the TestSoakFaults scale scenario (one cycle; 0 skips it)")

// scaleLease is the lease duration of the scale scenario: the library's
// default (3 * CheckInterval, whose default is one minute), so that its
// requests per replica per minute are those of a default deployment.
const scaleLease = 3 * time.Minute

// scaleScenario runs -soak.scale-replicas replicas (100 by default) with
// the default lease settings through, per cycle: 30 minutes at rest, a CA
// rotation (publication, promotion, retirement), a one-hour pause, and a
// ten-minute API outage (every request fails with 500) across a
// successor's minimum delay, then its promotion. It reports the requests
// per replica per minute at rest and per rotation phase (watches aside;
// renewals apart), and CPU time and heap per replica (each replica is a
// whole soak pod: Authority, SelfSigned, file provider, sni controller and
// TLS server, so both are upper bounds of the Authority's own). The
// invariant (no failed handshake) is checked after every step as in every
// scenario.
func scaleScenario() scenario {
	return scenario{
		name: fmt.Sprintf("scale-%d", *scaleReplicas),
		params: func(p *params) {
			p.offsets = make([]time.Duration, *scaleReplicas)
			p.lease = scaleLease
		},
		cycle: scaleCycle,
		// One cycle is the measurement; more would only cost time.
		maxCycles: 1,
		skip:      skipScale(),
	}
}

func skipScale() string {
	if *scaleReplicas <= 0 {
		return "-soak.scale-replicas=0"
	}
	return ""
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// budget is the requests of a stretch: every request but watches, and the
// Lease renewals among them.
type budget struct{ total, renewals int64 }

func (w *world) budget() budget {
	return budget{total: w.api.nonWatch(), renewals: w.api.renewals.Load()}
}

func (b budget) minus(o budget) budget { return budget{b.total - o.total, b.renewals - o.renewals} }

func (b budget) String() string {
	return fmt.Sprintf("%d requests (%d renewals, %d others)", b.total, b.renewals, b.total-b.renewals)
}

func scaleCycle(w *world, c int) {
	n := len(w.live())
	cpu0 := cpuTime()
	w.advance(time.Minute) // the start-up's last announcements
	w.advance(time.Minute)

	// At rest: minute by minute, every loop wakes as it would.
	const minutes = 30
	before := w.budget()
	restCPU := cpuTime()
	for range minutes {
		w.advance(time.Minute)
	}
	rest := w.budget().minus(before)
	restCPU = cpuTime() - restCPU
	_, heap := snapshotRuntime()
	perMin := float64(rest.total) / float64(n) / minutes
	w.t.Logf("soak report budget/%s cycle %d: at rest %d replicas x %d min: %v = %.2f requests per replica per minute; CPU %v per replica per minute; heap in use %d KiB per replica (%d KiB for %d pods)",
		w.name, c, n, minutes, rest, perMin, (restCPU / time.Duration(n*minutes)).Round(time.Microsecond),
		(heap-w.rep.heapBefore)/n, heap-w.rep.heapBefore, n)
	// One renewal a minute, and a Secret GET per two minutes: the fake API
	// server's watches send no bookmarks, and the Authority trusts a watch
	// that shows nothing for two minutes no longer (issue 27; on
	// kube-apiserver the bookmarks keep it at one).
	assert.LessOrEqual(w.t, rest.total, int64(n*minutes*3/2), "%s: more than 1.5 requests per replica per minute at rest: %v; API: %s", w.name, rest, w.api.verbs())

	// A rotation, phase by phase, stepping finely around each change.
	st, ok := w.caState()
	require.True(w.t, ok, "no CA secret")
	old := st.signing
	w.runTo(w.publishAt().Add(-time.Minute))
	before = w.budget()
	w.runUntil("publication of a successor CA", time.Hour, func() bool { st, _ = w.caState(); return st.next != nil })
	w.advance(time.Minute)
	publish := w.budget().minus(before)
	w.runTo(st.nextSince.Add(w.p.pd - time.Minute))
	before = w.budget()
	for s, _ := w.caState(); !s.signing.Equal(st.next); s, _ = w.caState() {
		require.False(w.t, w.t.Failed())
		require.True(w.t, w.now().Before(st.nextSince.Add(w.p.pd+time.Hour)), "%s: no promotion within an hour of the delay", w.name)
		w.advance(10 * time.Second)
	}
	w.advance(time.Minute)
	promote := w.budget().minus(before)
	w.runTo(old.NotAfter.Add(-time.Minute))
	before = w.budget()
	for s, _ := w.caState(); containsCert(s.bundle, old); s, _ = w.caState() {
		require.False(w.t, w.t.Failed())
		require.True(w.t, w.now().Before(old.NotAfter.Add(2*time.Hour)), "%s: the old CA was not retired", w.name)
		w.advance(time.Minute)
	}
	w.advance(time.Minute)
	retire := w.budget().minus(before)
	others := (publish.total - publish.renewals) + (promote.total - promote.renewals) + (retire.total - retire.renewals)
	w.t.Logf("soak report budget/%s cycle %d: one CA rotation, %d replicas: publish %v; promote %v; retire %v; %d requests beyond the renewals (%.1f per replica)",
		w.name, c, n, publish, promote, retire, others, float64(others)/float64(n))

	// Faults: a pause, then an API outage across a successor's delay.
	w.pause(time.Hour)
	w.toPublished()
	st, _ = w.caState()
	w.runTo(st.nextSince.Add(w.p.pd - time.Minute))
	w.api.fault.Store(internalErrorFault())
	w.fine(10*time.Minute, 5*time.Second, time.Minute)
	require.Positive(w.t, w.api.faultHits.Load(), "the fault was hit")
	w.api.fault.Store(nil)
	recovered := w.now()
	for s, _ := w.caState(); !s.signing.Equal(st.next); s, _ = w.caState() {
		require.False(w.t, w.t.Failed())
		require.True(w.t, w.now().Before(recovered.Add(time.Hour)), "%s: no promotion within an hour of the outage", w.name)
		w.advance(5 * time.Second)
	}
	w.t.Logf("soak report budget/%s cycle %d: promoted %v after the API server answered again; CPU %v per replica over the cycle; goroutines %d",
		w.name, c, w.now().Sub(recovered), ((cpuTime() - cpu0) / time.Duration(n)).Round(time.Millisecond), runtime.NumGoroutine())
}

func containsCert(bundle []*x509.Certificate, c *x509.Certificate) bool {
	return slices.ContainsFunc(bundle, c.Equal)
}
