//go:build soak

package soak

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clienttesting "k8s.io/client-go/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/sni"
)

var (
	cyclesFlag    = flag.Int("soak.cycles", 0, "fault cycles per TestSoakFaults scenario (one cycle is about one CA lifetime); 0 derives them from -soak.years")
	settleTimeout = flag.Duration("soak.settle-timeout", 60*time.Second, "real time every loop gets to wait on the clock again after a step")
	quietWindow   = flag.Duration("soak.quiet", 5*time.Millisecond, "real time without any activity that counts as settled")
	allScenarios  = flag.Bool("soak.all", false, "also run the TestSoakFaults scenarios that make test covers otherwise (make soak sets it)")
	knownIssues   = flag.Bool("soak.known-issues", false, "also run the TestSoakFaults scenarios that reproduce known failures of the implementation")
)

const (
	namespace   = "soak"
	secretName  = "ca"
	webhookName = "soak-webhook"

	authorityHost = "webhook.test"
	selfHost      = "self.test"
	fileHost      = "file.test"
)

// params are the lifetimes of a scenario. The defaults make a CA rotation
// every 8 days and a leaf rotation every 2 days; a normal step (12 h) is
// half the leaf renew-before, so nothing ever expires between two steps
// unless a scenario pauses.
type params struct {
	leaf, leafRenew time.Duration
	ca, caRenew     time.Duration
	// pd is the minimum propagation delay: a CA published at t may sign at
	// t+pd at the earliest.
	pd            time.Duration
	lease         time.Duration
	skewTolerance time.Duration // 0: the library default
	step          time.Duration
	// offsets are the replicas' clock skews; len(offsets) is the number of
	// replicas.
	offsets []time.Duration
	// bundleAge is how old a bundle a client may hold; default pd. Only the
	// negative controls change it.
	bundleAge time.Duration
	// publisherOnAll runs a caBundle publisher, observing its replica's
	// rotation, in every pod (as example/webhook does) instead of pod 0
	// only.
	publisherOnAll bool
	// noObserver leaves the publisher out of the rotation's observers
	// (negative control).
	noObserver bool
	// startFirst are started (and make the first CA) before the others.
	startFirst []int
	// skewed are the replicas whose clock (offset) is off beyond the skew
	// tolerance: they must never write the CA Secret, and their own
	// clients are not checked (their readiness fails, so a Service sends
	// them none).
	skewed []int
	// fileLeaf is the lifetime of the file pairs, rewritten every
	// fileEvery.
	fileLeaf, fileEvery time.Duration
	// caKeys keeps the Authority's CA keys in a shared key store
	// (world.keys) instead of the Secret.
	caKeys bool
}

func defaultParams() params {
	return params{
		leaf: 3 * day, leafRenew: day,
		ca: 12 * day, caRenew: 4 * day,
		pd:       12 * time.Hour,
		lease:    36 * time.Hour,
		step:     12 * time.Hour,
		offsets:  []time.Duration{0, 0, 0},
		fileLeaf: 6 * day, fileEvery: 2 * day,
	}
}

// world is one scenario: a fake API server, replicas ("pods") that each run
// an Authority replica, a SelfSigned provider, a file provider and an sni
// controller behind a TLS server on 127.0.0.1, and, in pod 0, the caBundle
// publisher. Only the test goroutine steps the clock; everything else runs
// in the components' own Run loops.
type world struct {
	t     *testing.T
	name  string
	p     params
	sim   *simClock
	api   *fakeAPI
	start time.Time
	ctx   context.Context
	stop  context.CancelFunc

	pods []*pod // current generation of each replica; nil while down
	gens []int
	all  []*pod // every pod ever started, for bundle logs and metrics

	dir     string // the watched file pair
	fileCA  *pki.Issued
	fileCur *pki.Issued // the pair last written whole
	fileBad bool        // the files hold a fault now
	fileAt  time.Time   // when fileCur was written

	activity atomic.Int64 // provider notifications and sni swaps
	events   *eventRecorder
	unsafeAt []time.Time // wakes at which an unsafe rotation is expected
	// emergencyAt are when a CA was marked compromised (emergency_test.go).
	emergencyAt []time.Time
	contender   *competitor

	poolMu sync.Mutex
	pools  map[string]*x509.CertPool

	rep *scenarioReport
	// keys is the CA key store the replicas share (params.caKeys), or nil.
	keys   *softKeyStore
	closed bool
	// control marks a negative control: failures are expected and
	// counted, not reported.
	control bool
	// race, while set, makes some replicas lose their Secret writes to the
	// others (podClient.loseRace).
	race atomic.Pointer[race]
	// The Secret's rotation state at the last step, for watchRotation.
	lastSigning, lastNext *x509.Certificate
	lastNextSince         time.Time
}

// pod is one replica process: its providers, controller, server and
// loops. A crash cancels all of them; a restart is a new pod.
type pod struct {
	w      *world
	idx    int
	name   string // "r1", "r1.g2" after restarts
	id     string // its Authority ReplicaID, the holderIdentity of its Lease
	offset time.Duration
	view   *offsetClock // the pod's clock, for the sni controller and clients

	client *podClient
	auth   *authority.Authority
	self   *authority.SelfSigned
	file   *dynamiccert.FileCertKey
	ctrl   *sni.DynamicServingCertificateController
	pub    *cabundle.Publisher
	srv    *tlsServer

	authLog, selfLog *bundleLog
	owners           []string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// crashOn, when set, makes the pod crash right after it commits a
	// Secret write of that kind ("publish" or "promote").
	crashOn  atomic.Pointer[string]
	crashed  atomic.Bool
	down     bool // torn down (test goroutine only)
	reported bool // its crash was handled (test goroutine only)
}

func (p *pod) provider(kind string) string { return p.w.name + "/" + p.name + "/" + kind }

// newWorld builds a scenario and starts every pod, then waits for them to
// serve.
func newWorld(t *testing.T, name string, p params) *world {
	t.Helper()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	w := &world{
		t: t, name: name, p: p,
		sim:    newSimClock(start),
		start:  start,
		gens:   make([]int, len(p.offsets)),
		pods:   make([]*pod, len(p.offsets)),
		dir:    t.TempDir(),
		events: &eventRecorder{},
		pools:  map[string]*x509.CertPool{},
		rep:    newScenarioReport(name),
	}
	w.ctx, w.stop = context.WithCancel(context.Background())
	if p.caKeys {
		w.keys = newSoftKeyStore()
	}
	t.Cleanup(w.close)
	w.api = newFakeAPI(&admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhookName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "validate.soak.test",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: namespace, Name: "soak"}},
			SideEffects:             new(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	})
	var err error
	w.fileCA, err = pki.NewCA(pki.Request{CommonName: "soak-file-ca", Now: start, Lifetime: 100 * 366 * day, Backdate: day})
	require.NoError(t, err)
	w.writePair()
	order := p.startFirst
	for i := range p.offsets {
		if !slices.Contains(order, i) {
			order = append(order, i)
		}
	}
	for n, i := range order {
		w.startPod(i)
		if n < len(p.startFirst) {
			w.settle() // it makes the first CA
		}
	}
	w.settle()
	w.pollBundles()
	w.check()
	return w
}

// close stops every pod and waits for all their goroutines. It may be
// called more than once.
func (w *world) close() {
	if w.closed {
		return
	}
	w.closed = true
	if w.keys != nil {
		w.keys.answer() // no call stays blocked on a hung key store
	}
	if w.contender != nil {
		w.contender.stop()
	}
	for _, p := range w.pods {
		if p != nil {
			p.teardown()
		}
	}
	w.stop()
}

func (w *world) now() time.Time { return w.sim.Now() }

// startPod starts replica idx (again).
func (w *world) startPod(idx int) *pod {
	t := w.t
	gen := w.gens[idx]
	w.gens[idx]++
	name := fmt.Sprintf("r%d", idx)
	if gen > 0 {
		name += fmt.Sprintf(".g%d", gen)
	}
	p := &pod{w: w, idx: idx, name: name, offset: w.p.offsets[idx]}
	p.ctx, p.cancel = context.WithCancel(w.ctx)
	p.view = w.sim.view(p.provider("view"), p.offset, false)
	p.client = &podClient{Interface: w.api.cs, api: w.api, afterSecretWrite: p.afterSecretWrite}
	clk := func(kind string, strict bool) *offsetClock {
		p.owners = append(p.owners, p.provider(kind))
		return w.sim.view(p.provider(kind), p.offset, strict)
	}
	// A restarted replica keeps its identity every other time (a
	// StatefulSet pod), and gets a new one otherwise (a Deployment pod).
	replicaID := fmt.Sprintf("%s-r%d", w.name, idx)
	if gen%2 == 1 {
		replicaID += fmt.Sprintf("-g%d", gen)
	}
	p.id = replicaID

	var err error
	authCfg := authority.Config{
		Name: p.provider("authority"), Namespace: namespace, SecretName: secretName, Client: p.client,
		Hosts: []string{authorityHost, "127.0.0.1"}, Lifetime: w.p.leaf, RenewBefore: w.p.leafRenew,
		CALifetime: w.p.ca, CARenewBefore: w.p.caRenew, PropagationDelay: w.p.pd,
		Clock: clk("authority", true),
	}
	if w.keys != nil {
		authCfg.CAKeys, authCfg.CAKeyTimeout = w.keys, hsmTimeout
	}
	p.auth, err = newAuthority(authCfg, extraOptions{replicaID: replicaID, lease: w.p.lease, skewTolerance: w.p.skewTolerance, recorder: w.events})
	require.NoError(t, err)
	p.self, err = newSelfSigned(authority.SelfSignedConfig{
		Name: p.provider("self-signed"), Hosts: []string{selfHost}, SNINames: []string{selfHost},
		Lifetime: w.p.leaf, RenewBefore: w.p.leafRenew, CALifetime: w.p.ca, CARenewBefore: w.p.caRenew,
		PropagationDelay: w.p.pd, Clock: clk("self-signed", true),
	}, extraOptions{skewTolerance: w.p.skewTolerance, recorder: w.events})
	require.NoError(t, err)
	p.file, err = dynamiccert.NewFileCertKey(dynamiccert.FileCertKeyConfig{
		Name: p.provider("file"), CertFile: filepath.Join(w.dir, "tls.crt"), KeyFile: filepath.Join(w.dir, "tls.key"),
		Clock: clk("file", false),
	})
	require.NoError(t, err)

	p.authLog = newBundleLog(p.provider("authority"))
	p.selfLog = newBundleLog(p.provider("self-signed"))
	p.auth.AddListener(&bundleListener{w: w, log: p.authLog, bundle: p.auth.CurrentCABundleContent})
	p.self.AddListener(&bundleListener{w: w, log: p.selfLog, bundle: p.self.CurrentCABundleContent})
	p.selfLog.record(w.now(), p.self.CurrentCABundleContent())

	p.ctrl, err = sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: p.auth,
		SNI:   []dynamiccertificates.SNICertKeyContentProvider{p.self, p.file},
		Clock: p.view, Name: p.provider("sni")})
	require.NoError(t, err)
	p.ctrl.AddListener(activityListener{&w.activity})

	if idx == 0 || w.p.publisherOnAll {
		p.pub, err = newPublisher(cabundle.PublisherConfig{
			Source:     p.auth,
			Targets:    []cabundle.Target{{Kind: cabundle.ValidatingWebhookConfiguration, Name: webhookName}},
			KubeClient: p.client,
		}, p.provider("cabundle"), clk("cabundle", false), w.events)
		require.NoError(t, err)
		if !w.p.noObserver {
			observe(p.auth, p.pub)
		}
	}

	p.srv = serveTLS(t, p.ctrl.TLSConfig())
	p.wg.Go(func() { p.auth.Run(p.ctx, 1) })
	p.wg.Go(func() { p.self.Run(p.ctx, 1) })
	p.wg.Go(func() { p.file.Run(p.ctx, 1) })
	p.wg.Go(func() { p.ctrl.Run(p.ctx, 1) })
	if p.pub != nil {
		p.wg.Go(func() { p.pub.Run(p.ctx, 0) })
	}
	w.pods[idx] = p
	w.all = append(w.all, p)
	return p
}

// afterSecretWrite crashes the pod right after it committed the Secret
// write it was armed for: the Secret holds the write, the replica never
// hears back, and never makes the leaf that would have followed.
func (p *pod) afterSecretWrite(before, after *corev1.Secret) error {
	if r := p.w.race.Load(); r != nil && p.client.loseRace.Load() == nil {
		r.won() // the replicas that lose the race to this write learn so
	}
	kind := p.crashOn.Load()
	if kind == nil || secretWriteKind(before, after) != *kind {
		return nil
	}
	if !p.crashOn.CompareAndSwap(kind, nil) {
		return nil
	}
	p.crashed.Store(true)
	// A crash sends nothing more: no graceful release of its Lease.
	p.client.fault.Store(&apiFault{name: "crashed", err: func(clienttesting.Action) error { return context.Canceled }})
	p.cancel()
	return context.Canceled
}

// secretWriteKind classifies a write of the CA Secret: "create", "publish"
// (a successor appeared), "promote" (the signing CA changed) or "other".
func secretWriteKind(before, after *corev1.Secret) string {
	switch {
	case before == nil:
		return "create"
	case !bytes.Equal(before.Data[corev1.TLSCertKey], after.Data[corev1.TLSCertKey]):
		return "promote"
	case len(after.Data[authority.NextCertKey]) > 0 &&
		!bytes.Equal(before.Data[authority.NextCertKey], after.Data[authority.NextCertKey]):
		return "publish"
	}
	return "other"
}

// kill stops the pod as a SIGKILL does: it sends nothing more, so its Lease
// stays behind (a graceful teardown deletes it).
func (p *pod) kill() {
	p.client.fault.Store(&apiFault{name: "killed", err: func(clienttesting.Action) error { return context.Canceled }})
	p.teardown()
}

// teardown stops the pod and waits for its goroutines; its bundles are no
// longer published from now on.
func (p *pod) teardown() {
	if p.down {
		return
	}
	p.down = true
	p.cancel()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(*settleTimeout):
		p.w.t.Fatalf("%s: loops did not stop within %v after cancellation", p.name, *settleTimeout)
	}
	p.srv.close()
	for _, o := range p.owners {
		p.w.sim.forget(o)
	}
	now := p.w.now()
	p.authLog.record(now, nil)
	p.selfLog.record(now, nil)
	p.w.pods[p.idx] = nil
}

// reapCrashed tears down pods that crashed in the last step.
func (w *world) reapCrashed() []*pod {
	var out []*pod
	for _, p := range w.pods {
		if p != nil && p.crashed.Load() {
			p.teardown()
			out = append(out, p)
		}
	}
	return out
}

func (w *world) live() []*pod {
	var out []*pod
	for _, p := range w.pods {
		if p != nil && !p.crashed.Load() {
			out = append(out, p)
		}
	}
	return out
}

type activityListener struct{ n *atomic.Int64 }

func (a activityListener) Enqueue() { a.n.Add(1) }

// bundleListener records every CA bundle a provider publishes, with the
// (true) simulated time it was published at.
type bundleListener struct {
	w      *world
	log    *bundleLog
	bundle func() []byte
}

func (l *bundleListener) Enqueue() {
	l.w.activity.Add(1)
	l.log.record(l.w.now(), l.bundle())
}

// bundleLog is the history of one provider's CA bundle.
type bundleLog struct {
	name     string
	mu       sync.Mutex
	versions []bundleVersion
}

type bundleVersion struct {
	at  time.Time
	pem []byte // nil: the provider stopped (its pod is down)
}

func newBundleLog(name string) *bundleLog { return &bundleLog{name: name} }

func (l *bundleLog) record(at time.Time, pem []byte) {
	if pem != nil && len(pem) == 0 {
		return // not known yet
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.versions); n > 0 {
		last := l.versions[n-1]
		if (last.pem == nil) == (pem == nil) && bytes.Equal(last.pem, pem) {
			return
		}
		if last.pem == nil {
			return // stopped for good
		}
	}
	l.versions = append(l.versions, bundleVersion{at: at, pem: bytes.Clone(pem)})
}

// window returns the versions a client may hold at to if it fetched the
// bundle at or after from: the version in force at from (the oldest a
// client refreshing every pd holds) and every later one.
func (l *bundleLog) window(from, to time.Time) []bundleVersion {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []bundleVersion
	first := 0
	for i, v := range l.versions {
		if !v.at.After(from) {
			first = i
		}
	}
	for _, v := range l.versions[first:] {
		if v.at.After(to) {
			break
		}
		if v.pem != nil {
			out = append(out, v)
		}
	}
	return out
}

// pollBundles records bundles whose change was not notified.
func (w *world) pollBundles() {
	now := w.now()
	for _, p := range w.live() {
		p.authLog.record(now, p.auth.CurrentCABundleContent())
		p.selfLog.record(now, p.self.CurrentCABundleContent())
	}
}

// settle waits until every loop waits on the clock again: no tick left
// unconsumed, every strict loop back on a timer, every server serving its
// providers' current certificates, every healthy replica on the Secret's
// current bundle, every file provider on the files, and no activity for
// the quiet window. It fails the test after -soak.settle-timeout.
func (w *world) settle() {
	w.t.Helper()
	calls0 := w.api.calls.Load()
	settleLoops(w.t, settleSpec{
		sim:        w.sim,
		what:       func() string { return w.name + " at " + w.simTime() },
		activity:   w.activityCount,
		notSettled: func() string { w.reapCrashed(); return w.notSettled() },
		hotLoop:    func() { w.hotLoop(calls0) },
		describe:   func() string { return "API: " + w.api.verbs() + "\n" + w.api.lastRequests() },
	})
}

// hotLoop records loops that re-armed due timers maxZeroSteps times
// within one instant, and lets them wait for the next step instead.
func (w *world) hotLoop(calls0 int64) {
	what := w.sim.dueOwners()
	detail := ""
	if st, ok := w.caState(); ok && st.next != nil {
		detail = fmt.Sprintf("; successor %s published at %s still waits", serialOf(st.next), st.nextSince.Format(time.RFC3339))
		if p := w.live(); len(p) > 0 {
			if status, ok := authorityStatus(p[0].auth); ok {
				detail += fmt.Sprintf(" for %v", status.pending)
			}
		}
	}
	msg := fmt.Sprintf("%s at %s: hot loop: %s re-armed already due timers %d times in one instant (%d API requests meanwhile)%s",
		w.name, w.simTime(), strings.Join(what, ", "), maxZeroSteps, w.api.calls.Load()-calls0, detail)
	w.rep.hotLoops++
	if w.rep.hotLoops <= 3 {
		w.t.Log(msg)
	}
	if *knownIssues {
		w.t.Error(msg)
	}
}

func (w *world) activityCount() int64 {
	return w.api.calls.Load() + w.activity.Load()
}

func (w *world) notSettled() string {
	secret := w.api.secret(namespace, secretName)
	faulty := w.api.fault.Load() != nil
	for _, p := range w.live() {
		if slices.Contains(w.p.skewed, p.idx) {
			// It serves what it has, or nothing; it only has to hold the
			// Secret's bundle.
			if !faulty && secret != nil && !bytes.Equal(p.auth.CurrentCABundleContent(), secret.Data[dynamiccert.SecretCAKey]) {
				return p.name + ": authority bundle differs from the Secret's"
			}
			continue
		}
		leaf := p.auth.Leaf()
		if leaf == nil {
			return p.name + ": authority has no leaf yet"
		}
		if !faulty && p.client.fault.Load() == nil && p.client.loseRace.Load() == nil && secret != nil && p.auth.LastError() == nil && !bytes.Equal(p.auth.CurrentCABundleContent(), secret.Data[dynamiccert.SecretCAKey]) {
			return p.name + ": authority bundle differs from the Secret's"
		}
		if fc := parsedLeaf(p.file); !w.fileBad && (fc == nil || !fc.Leaf.Equal(w.fileCur.Cert)) {
			return p.name + ": file provider does not serve the files yet"
		}
		if w.fileBad && p.file.LastError() == nil {
			return p.name + ": file provider has not seen the bad files yet"
		}
		served := map[string]string{}
		for _, s := range p.ctrl.Served() {
			served[s.Provider] = s.Serial
		}
		want := map[string]*x509.Certificate{p.auth.Name(): leaf, p.self.Name(): p.self.Leaf()}
		if fc := parsedLeaf(p.file); fc != nil {
			want[p.file.Name()] = fc.Leaf
		}
		for prov, c := range want {
			if served[prov] != c.SerialNumber.Text(16) {
				return fmt.Sprintf("%s: sni controller does not serve %s's current certificate %s yet", p.name, prov, c.SerialNumber.Text(16))
			}
		}
	}
	return ""
}

func (w *world) simTime() string {
	return fmt.Sprintf("%s (+%s)", w.now().Format(time.RFC3339), formatDuration(w.now().Sub(w.start)))
}

// advance moves the clock by d in one step, waits for every loop, reaps
// crashed pods, rewrites the file pair when due, and checks the invariant.
func (w *world) advance(d time.Duration) {
	w.t.Helper()
	if d <= 0 {
		d = time.Second
	}
	w.sim.step(d)
	w.settle()
	if !w.fileBad && w.now().Sub(w.fileAt) >= w.p.fileEvery {
		w.writePair()
		w.settle()
	}
	w.api.cs.ClearActions() // the fake clientset records every request
	w.pollBundles()
	w.watchRotation()
	w.rep.steps++
	w.check()
}

// runTo steps (at most p.step at a time) until the clock reads at.
func (w *world) runTo(at time.Time) {
	w.t.Helper()
	for w.now().Before(at) && !w.t.Failed() {
		w.advance(min(w.p.step, at.Sub(w.now())))
	}
}

func (w *world) runFor(d time.Duration) { w.runTo(w.now().Add(d)) }

// runUntil steps until cond holds, at most max simulated time.
func (w *world) runUntil(what string, max time.Duration, cond func() bool) {
	w.t.Helper()
	end := w.now().Add(max)
	for !cond() {
		if !w.now().Before(end) || w.t.Failed() {
			w.t.Fatalf("%s at %s: %s did not happen within %v", w.name, w.simTime(), what, max)
		}
		w.advance(min(w.p.step, end.Sub(w.now())))
	}
}

// pause moves the clock by d in one step: a suspended VM, a stopped
// cluster.
func (w *world) pause(d time.Duration) {
	w.t.Helper()
	w.rep.paused += d
	w.advance(d)
}

// fine steps through d from one timer deadline to the next (at least
// minStep, at most maxStep apart), so that every retry of every loop
// happens at its own time. It returns the requests made meanwhile.
func (w *world) fine(d, minStep, maxStep time.Duration) int64 {
	w.t.Helper()
	before := w.api.calls.Load()
	end := w.now().Add(d)
	for w.now().Before(end) && !w.t.Failed() {
		step := maxStep
		if next := w.sim.nextDeadline(); !next.IsZero() {
			step = min(max(next.Sub(w.now()), minStep), maxStep)
		}
		w.advance(min(step, end.Sub(w.now())))
	}
	return w.api.calls.Load() - before
}

// caState is the CA Secret as the replicas share it.
type caState struct {
	signing, next *x509.Certificate
	nextSince     time.Time
	bundle        []*x509.Certificate
}

func (w *world) caState() (caState, bool) {
	s := w.api.secret(namespace, secretName)
	if s == nil {
		return caState{}, false
	}
	var st caState
	if c, err := pki.ParseCABundle(s.Data[corev1.TLSCertKey]); err == nil && len(c) > 0 {
		st.signing = c[0]
	}
	if c, err := pki.ParseCABundle(s.Data[authority.NextCertKey]); err == nil && len(c) > 0 {
		st.next = c[0]
		st.nextSince, _ = time.Parse(time.RFC3339, s.Annotations[authority.NextSinceAnnotation])
	}
	st.bundle, _ = pki.ParseCABundle(s.Data[dynamiccert.SecretCAKey])
	return st, st.signing != nil
}

// publishAt is when the signing CA's successor is due (true time, for a
// replica without skew).
func (w *world) publishAt() time.Time {
	st, ok := w.caState()
	require.True(w.t, ok, "no CA secret")
	return st.signing.NotAfter.Add(-w.p.caRenew)
}

// toPublished steps to the publication of the Authority's next successor
// and returns it.
func (w *world) toPublished() *x509.Certificate {
	w.t.Helper()
	if st, _ := w.caState(); st.next == nil {
		w.runTo(w.publishAt())
	}
	var st caState
	w.runUntil("publication of a successor CA", w.p.ca, func() bool { st, _ = w.caState(); return st.next != nil })
	return st.next
}

// toPromoted steps until the Authority's successor published now signs.
func (w *world) toPromoted() {
	w.t.Helper()
	st, _ := w.caState()
	if st.next == nil {
		return
	}
	successor := st.next
	w.runUntil("promotion of the successor CA", w.p.ca, func() bool {
		st, _ := w.caState()
		return st.signing != nil && st.signing.Equal(successor)
	})
}

// toAllPublished is toPublished for the Authority and every SelfSigned
// provider at once: a pause that must come right after a publication.
func (w *world) toAllPublished() {
	w.t.Helper()
	w.toPublished()
	w.runUntil("publication of the SelfSigned successors", w.p.ca, func() bool {
		return w.selfSigned(func(s rotationStatus) bool { return s.successorSerial != "" })
	})
}

// toAllPromoted is toPromoted for the Authority and every SelfSigned
// provider.
func (w *world) toAllPromoted() {
	w.t.Helper()
	w.toPromoted()
	w.runUntil("promotion of the SelfSigned successors", w.p.ca, func() bool {
		return w.selfSigned(func(s rotationStatus) bool { return s.successorSerial == "" })
	})
}

// selfSigned reports whether every live SelfSigned provider's status
// satisfies cond.
func (w *world) selfSigned(cond func(rotationStatus) bool) bool {
	for _, p := range w.live() {
		if st, ok := selfSignedStatus(p.self); ok && !cond(st) {
			return false
		}
	}
	return true
}

// watchRotation logs every change of the Secret's signing CA: a promotion
// (after how long), or a CA that signs without having been published.
func (w *world) watchRotation() {
	st, ok := w.caState()
	if !ok {
		return
	}
	if w.lastSigning != nil && !st.signing.Equal(w.lastSigning) {
		if w.lastNext != nil && st.signing.Equal(w.lastNext) {
			waited := w.now().Sub(w.lastNextSince)
			w.rep.maxPromotionWait = max(w.rep.maxPromotionWait, waited)
			w.t.Logf("%s at %s: successor %s published at %s signs after %s", w.name, w.simTime(), serialOf(st.signing),
				w.lastNextSince.Format(time.RFC3339), formatDuration(waited))
		} else {
			w.t.Logf("%s at %s: CA %s signs, never published as a successor before", w.name, w.simTime(), serialOf(st.signing))
		}
	}
	w.lastSigning, w.lastNext, w.lastNextSince = st.signing, st.next, st.nextSince
}

func serialOf(c *x509.Certificate) string { return c.SerialNumber.Text(16)[:8] }

// webhookBundle is the caBundle the ValidatingWebhookConfiguration holds now.
func (w *world) webhookBundle() []byte {
	obj, err := w.api.get(admissionregistrationv1.SchemeGroupVersion.WithResource("validatingwebhookconfigurations"), "", webhookName)
	if err != nil {
		return nil
	}
	vwc := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
	if len(vwc.Webhooks) == 0 {
		return nil
	}
	return vwc.Webhooks[0].ClientConfig.CABundle
}

// candidate is a trust bundle some client may hold now.
type candidate struct {
	pem    []byte
	source string
	at     time.Time
	exempt bool // from before an expected unsafe rotation
}

// check is the invariant: a client holding a CA bundle as some provider
// published it at least the propagation delay ago (or later), or as its
// caBundle target holds it now, completes a handshake with every server,
// verifying at the server's own time. Failures of bundles from before an
// expected unsafe rotation are counted apart.
func (w *world) check() {
	now := w.now()
	age := w.p.pd
	if w.p.bundleAge > 0 {
		age = w.p.bundleAge
	}
	from := now.Add(-age)
	var authority []candidate
	for _, p := range w.all {
		for _, v := range p.authLog.window(from, now) {
			authority = append(authority, candidate{pem: v.pem, source: p.authLog.name, at: v.at, exempt: w.exempt(v.at) || w.beforeEmergency(v.at)})
		}
	}
	if vwc := w.webhookBundle(); len(vwc) > 0 && (w.contender == nil || !w.contender.wrote(vwc)) {
		authority = append(authority, candidate{pem: vwc, source: "ValidatingWebhookConfiguration " + webhookName, at: now})
	}
	file := []candidate{{pem: w.fileCA.CertPEM, source: "file CA", at: w.start}}

	type job struct {
		p    *pod
		name string
		c    candidate
	}
	var jobs []job
	for _, p := range w.live() {
		if slices.Contains(w.p.skewed, p.idx) {
			continue // clients of the healthy replicas only
		}
		var self []candidate
		for _, v := range p.selfLog.window(from, now) {
			self = append(self, candidate{pem: v.pem, source: p.selfLog.name, at: v.at, exempt: w.exempt(v.at)})
		}
		for _, set := range []struct {
			name  string
			cands []candidate
		}{{authorityHost, authority}, {selfHost, self}, {fileHost, file}} {
			for _, c := range dedupe(set.cands) {
				jobs = append(jobs, job{p, set.name, c})
			}
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, j := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			w.handshake(j.p, j.name, j.c)
		})
	}
	wg.Wait()
}

// exempt reports whether a bundle published at at predates an expected
// unsafe rotation, so that a client holding it may fail.
func (w *world) exempt(at time.Time) bool {
	for _, u := range w.unsafeAt {
		if at.Before(u) && !w.now().Before(u) {
			return true
		}
	}
	return false
}

// dedupe keeps one candidate per distinct bundle; a bundle is exempt only
// if every source of it is.
func dedupe(cs []candidate) []candidate {
	var out []candidate
	for _, c := range cs {
		i := slices.IndexFunc(out, func(o candidate) bool { return bytes.Equal(o.pem, c.pem) })
		switch {
		case i < 0:
			out = append(out, c)
		case !c.exempt && out[i].exempt:
			out[i] = c
		}
	}
	return out
}

func (w *world) pool(pem []byte) *x509.CertPool {
	w.poolMu.Lock()
	defer w.poolMu.Unlock()
	if p, ok := w.pools[string(pem)]; ok {
		return p
	}
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(pem)
	if len(w.pools) > 1000 {
		clear(w.pools)
	}
	w.pools[string(pem)] = p
	return p
}

func (w *world) handshake(p *pod, name string, c candidate) {
	w.rep.handshakes.Add(1)
	// X25519 alone: the post-quantum hybrid costs more than the rest of the
	// handshake and says nothing about certificates.
	cfg := &tls.Config{ServerName: name, RootCAs: w.pool(c.pem), Time: p.view.Now, MinVersion: tls.VersionTLS12,
		CurvePreferences: []tls.CurveID{tls.X25519}}
	_, err := tlstest.Handshake(p.srv.addr, cfg)
	if err == nil {
		return
	}
	if c.exempt {
		w.rep.expectedFailures.Add(1)
		return
	}
	if w.control {
		w.rep.controlFailures.Add(1)
		return
	}
	w.rep.failures.Add(1)
	served, _ := tlstest.Handshake(p.srv.addr, &tls.Config{ServerName: name, InsecureSkipVerify: true})
	desc := "nothing"
	if served != nil {
		desc = fmt.Sprintf("serial %s issued by %q (key %x) valid %s to %s", served.SerialNumber.Text(16), served.Issuer.CommonName,
			served.AuthorityKeyId, served.NotBefore.Format(time.RFC3339), served.NotAfter.Format(time.RFC3339))
	}
	w.t.Errorf("%s at %s: %s on %s (clock %s) failed for a client holding the bundle of %s published at %s: %v\n  served: %s\n  trusted: %s",
		w.name, w.simTime(), name, p.name, p.view.Now().Format(time.RFC3339), c.source, c.at.Format(time.RFC3339), err,
		desc, describeBundle(c.pem))
}

func describeBundle(pem []byte) string {
	certs, err := pki.ParseCABundle(pem)
	if err != nil {
		return "unparsable: " + err.Error()
	}
	var parts []string
	for _, c := range certs {
		parts = append(parts, fmt.Sprintf("%q (key %x) %s to %s", c.Subject.CommonName, c.SubjectKeyId,
			c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339)))
	}
	return strings.Join(parts, ", ")
}

// writePair writes a new leaf signed by the file CA, key and certificate,
// each by rename so that the provider never reads a torn file.
func (w *world) writePair() {
	leaf := w.newFileLeaf()
	w.writeFile("tls.key", leaf.KeyPEM)
	w.writeFile("tls.crt", leaf.CertPEM)
	w.fileCur, w.fileAt, w.fileBad = leaf, w.now(), false
}

// newFileLeaf issues a pair for the file providers, backdated by two hours
// as an issuer that knows about skewed clients would.
func (w *world) newFileLeaf() *pki.Issued {
	leaf, err := pki.IssueLeaf(w.fileCA, pki.Request{CommonName: fileHost, DNSNames: []string{fileHost}, Now: w.now(),
		Lifetime: w.p.fileLeaf, Backdate: 2 * time.Hour})
	require.NoError(w.t, err)
	return leaf
}

func (w *world) writeFile(name string, data []byte) {
	path := filepath.Join(w.dir, name)
	require.NoError(w.t, os.RemoveAll(path+".tmp"))
	require.NoError(w.t, os.WriteFile(path+".tmp", data, 0o600))
	if fi, err := os.Lstat(path); err == nil && fi.IsDir() {
		require.NoError(w.t, os.RemoveAll(path))
	}
	require.NoError(w.t, os.Rename(path+".tmp", path))
}

// tlsServer accepts TLS connections on 127.0.0.1, completes the handshake
// and writes one byte, as tlstest.Server does, until closed.
type tlsServer struct {
	ln   net.Listener
	addr string
	wg   sync.WaitGroup
}

func serveTLS(t *testing.T, cfg *tls.Config) *tlsServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &tlsServer{ln: ln, addr: ln.Addr().String()}
	s.wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() {
				defer conn.Close()
				tc := tls.Server(conn, cfg)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if tc.Handshake() == nil {
					_, _ = tc.Write([]byte{1})
				}
			})
		}
	})
	return s
}

func (s *tlsServer) close() {
	_ = s.ln.Close()
	s.wg.Wait()
}

// eventRecorder counts the Events evercert sends, by type and reason.
type eventRecorder struct {
	mu     sync.Mutex
	counts map[string]int
	notes  []string
}

func (r *eventRecorder) Eventf(_ runtime.Object, _ runtime.Object, eventtype, reason, _ /*action*/, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[eventtype+"/"+reason]++
	if len(r.notes) < 20 {
		r.notes = append(r.notes, eventtype+" "+reason+": "+fmt.Sprintf(note, args...))
	}
}

func (r *eventRecorder) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k, v := range r.counts {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

func (r *eventRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.counts))
	for k := range r.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.counts[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// competitor is another writer of the webhook's caBundle: it reacts to
// every write of someone else's by writing its own bundle back, at API
// latency, until stopped.
type competitor struct {
	api    *fakeAPI
	bundle []byte
	writes atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
}

func startCompetitor(w *world) *competitor {
	ca, err := pki.NewCA(pki.Request{CommonName: "someone-elses-ca", Now: w.now(), Lifetime: 365 * day})
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(w.ctx)
	c := &competitor{api: w.api, bundle: ca.CertPEM, cancel: cancel, done: make(chan struct{})}
	gvr := admissionregistrationv1.SchemeGroupVersion.WithResource("validatingwebhookconfigurations")
	watcher, err := w.api.tracker.Watch(gvr, "", metav1.ListOptions{})
	require.NoError(w.t, err)
	go func() {
		defer close(c.done)
		defer watcher.Stop()
		c.overwrite(gvr)
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-watcher.ResultChan():
				if !ok {
					return
				}
				if vwc, ok := ev.Object.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok && vwc.Name == webhookName &&
					len(vwc.Webhooks) > 0 && !bytes.Equal(vwc.Webhooks[0].ClientConfig.CABundle, c.bundle) {
					c.overwrite(gvr)
				}
			}
		}
	}()
	w.contender = c
	return c
}

// overwrite writes the competitor's bundle into every webhook, as an update
// by its own field manager.
func (c *competitor) overwrite(gvr schema.GroupVersionResource) {
	obj, err := c.api.tracker.Get(gvr, "", webhookName)
	if err != nil {
		return
	}
	vwc := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration).DeepCopy()
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].ClientConfig.CABundle = c.bundle
	}
	if c.api.tracker.Update(gvr, vwc, "", metav1.UpdateOptions{FieldManager: "soak-competitor"}) == nil {
		c.writes.Add(1)
	}
}

func (c *competitor) wrote(pem []byte) bool { return bytes.Equal(pem, c.bundle) }

func (c *competitor) stop() {
	c.cancel()
	<-c.done
}

// parsedLeaf returns the pair p serves, nil before its first good load.
func parsedLeaf(p *dynamiccert.FileCertKey) *tls.Certificate {
	_, _, c := p.CurrentParsedCertKeyContent()
	return c
}
