package authority

// The simulator's adoption plans (issue 27 §8 bullet 1, issue 28 §2): about
// one plan in five starts on a Secret in cert-controller's layout, every
// replica adopting it (Config.Adopt = LayoutCertController), and draws
// "oldrot" faults: the old rotator's pods still running for a while (a
// rolling update straight from the old tool's pods to evercert's), which
// rewrite the Secret in their layout whenever it lacks ca.key (their
// answer to an adoption) and possibly on their own cadence, and serve
// their current leaf meanwhile. Every choice of these plans is drawn from
// a random source of its own (simAdoptSalt), so the plans of the other
// seeds stay exactly what they were.

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/internal/pki"
)

// simAdoptSalt seeds the adoption draws (seed ^ simAdoptSalt), apart from
// the plan's other draws.
const simAdoptSalt = 0x5eed0ad0

// simOldLifetime is the lifetime of the old rotator's CAs and leaves:
// cert-controller's default, ten years (backdated an hour, as it does).
const simOldLifetime = 10 * 365 * 24 * time.Hour

// simAdoptHead is how simPlan.String names an adoption plan.
const simAdoptHead = "adopting cert-controller's Secret"

// Bounds of the adoption invariants (docs/architecture.md, "Simulator"):
var (
	// simHoldGrace (A1): how long after the old rotator's rewrite a
	// replica that holds adds its CA to the bundle it publishes: a watch
	// delivery, the check it kicks, and a check interval for a check that
	// waited for a backoff (a write that conflicted with the rewrite).
	simHoldGrace = simWatchLag + simCheck
	// simAdoptSettle (A3): once the old rotator stopped and every other
	// fault is over, the quiet period at its longest (ten check
	// intervals), a kept CA's retirement (a leaf lifetime and a check
	// interval) and a lease (a peer's announcement of a leaf of it ages
	// out) bring ca.crt down to the CAs a served leaf needs.
	simAdoptSettle = 10*simCheck + simLifetime + simCheck + simLease
)

// simAdoptGrowth (A2) is how many more of the old rotator's CAs that no
// live replica serves a leaf of ca.crt may hold, while it runs, than when
// it started: the adoption after an
// episode keeps the adopted CA, and the ones served then until their
// retirement (foreignWriter); a replica that starts during the overlap
// adopts the rewrite it reads first. Adopting each rewrite (no hold) adds
// one per rewrite.
const simAdoptGrowth = 3

// simAdoptBundle (A3) is how many CAs ca.crt may hold, besides the CAs of
// the leaves live replicas serve and the anchor (the CA adopted when the
// migration began, which stays until it expires), once the overlap
// settled: signing, successor, previous.
const simAdoptBundle = 3

// simAdoptWrites (A3) bounds the Secret writes of the replicas within any
// simLifetime of the settled window: a rotation step, a retirement, a
// Lease's CA collected, each written by a replica or two.
const simAdoptWrites = 8

// simAdoptDraws: simDraw draws adoption plans (-sim.adopt, and the
// mutation search). Off in make test-sim's TestSimulate while some
// adoption seeds still break an invariant (docs/architecture.md,
// "Simulator"); the adoption regressions run whatever it says. Set
// between searches only, never during one.
var simAdoptDraws bool

// simDrawAdopt draws, from its own source, whether plan p starts on a
// cert-controller Secret and, if so, its oldrot faults: one or two
// windows of the old rotator's pods running, 1 to 15 check intervals each,
// in the first third of the run (a third of them from the start: the
// rolling update that brought the replicas), each answering an adoption
// after 1 to 30 s and, in half of them, rewriting on a cadence of its own.
func simDrawAdopt(p *simPlan) {
	arng := rand.New(rand.NewSource(p.Seed ^ simAdoptSalt))
	if !simAdoptDraws || arng.Intn(5) != 0 {
		return
	}
	p.Adopt = true
	third := p.horizon() / 3
	for range 1 + arng.Intn(2) {
		f := simFault{Kind: "oldrot", Slot: -1, Dur: time.Duration(1+arng.Intn(15)) * simCheck}
		if arng.Intn(3) != 0 {
			f.At = time.Duration(arng.Int63n(int64(third))).Truncate(time.Second)
		}
		f.Arg = fmt.Sprintf("answer %v", time.Duration(1+arng.Intn(30))*time.Second)
		if arng.Intn(2) == 0 {
			f.Arg += fmt.Sprintf(" every %v", time.Duration(20+arng.Intn(281))*time.Second)
		}
		p.Faults = append(p.Faults, f)
	}
	slices.SortStableFunc(p.Faults, func(a, b simFault) int { return int(a.At - b.At) })
}

// parseSimPlanAdopt is parseSimPlan for a plan that may adopt
// (simAdoptHead); its oldrot faults read as any other.
func parseSimPlanAdopt(s string) (simPlan, error) {
	p, err := parseSimPlan(s)
	p.Adopt = strings.Contains(strings.SplitN(s, "\n", 2)[0], simAdoptHead)
	return p, err
}

// simAdopt is the adoption plan's part of the world: the old rotator and
// what the adoption invariants keep.
type simAdopt struct {
	rng *rand.Rand // the answer delays' jitter and the CAs' names
	n   int        // CAs the old rotator made
	// until: its pods run until then (the latest oldrot window's end);
	// answer and every: its answer delay and cadence (0: none) in force.
	until         time.Time
	answer, every time.Duration
	// answerQ: a rewrite answering an adoption is queued; tickGen tells
	// the cadence timer of an earlier window to stop.
	answerQ bool
	tickGen int
	// cur is the fingerprint of its current CA, written at curAt (its
	// pods serve a leaf of it while they run); curRV the resourceVersion
	// of that rewrite.
	cur   string
	curAt time.Time
	curRV string
	// cas are every CA it made.
	cas map[string]bool
	// hadLeaf: the processes that served a leaf when the current rewrite
	// was written (they had a state in force: the rewrite is held).
	hadLeaf map[*simProc]bool
	// base is ca.crt's size when the running window started (A2).
	base int
	// runningSince: the pods run since then (zero: not running).
	runningSince time.Time
	// stopped is when the pods last stopped.
	stopped time.Time
	// writes are the replicas' Secret writes (A3), and contents what
	// each wrote (signing, successor, bundle), since the settled window.
	writes   []time.Time
	contents []string
	// targetHad and ctbHad are the old rotator's CAs the caBundle target
	// and the ClusterTrustBundle ever held (adoptHad).
	targetHad, ctbHad map[string]bool
	// settledJudged: A3 judged this run (simStats.adoptSettled).
	settledJudged bool
	// anchor is the fingerprint of the CA the replicas' first write
	// signed with when it is the old rotator's: the CA adopted when the
	// migration began, which stays in ca.crt until it expires
	// (docs/migrating.md; AnchorCAAnnotation). A3 does not count it.
	anchor      string
	anchorKnown bool
	// noWriter: the mutation "no-hold" (the replicas run without the
	// foreignWriter); noRetire: "no-retire".
	noWriter, noRetire bool
}

// adoptInit puts the old rotator's Secret in place before the replicas
// start: its CA in the caBundle target and the ClusterTrustBundle (the
// old tool injected it), trusted from the start.
func (w *simWorld) adoptInit() {
	a := &simAdopt{rng: rand.New(rand.NewSource(w.plan.Seed ^ simAdoptSalt ^ 1)), cas: map[string]bool{}, hadLeaf: map[*simProc]bool{},
		targetHad: map[string]bool{}, ctbHad: map[string]bool{},
		noWriter: w.mutation == "no-hold", noRetire: w.mutation == "no-retire"}
	w.adopt = a
	w.stats.adoptPlans = 1
	data, fp := w.oldRotatorCA()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: simNamespace, Name: simSecret}, Type: corev1.SecretTypeOpaque, Data: data}
	s.ResourceVersion = w.nextRV()
	a.cur, a.curAt, a.curRV = fp, w.now, s.ResourceVersion
	w.setSecret(s)
	fps := map[string]bool{fp: true}
	if slices.Contains(w.plan.Publishers, true) {
		w.target = append(w.target, simBundle{at: w.now, fps: fps, by: -1})
		a.targetHad[fp] = true
	}
	if slices.Contains(w.plan.CTB, true) {
		w.ctb = append(w.ctb, simBundle{at: w.now, fps: fps, by: -1})
		a.ctbHad[fp] = true
	}
	// No CA signs unannounced at the start: the old rotator's was trusted
	// before (S1 and S2 judge every CA).
	w.first = "cert-controller"
}

// adoptHad returns the old rotator's CAs that the target whose history is
// hist ever held; nil outside adoption plans. The old rotator's CA is
// trusted by the old tool's means (cert-controller injects it into the
// webhooks' caBundles itself, and nothing into a ClusterTrustBundle), which
// the simulator does not model: a replica that adopts it at its first
// read signs with it at once, by design, whether or not an evercert
// publisher ever published it (one stopped while the old rotator wrote).
// S1 and S2 judge such a CA for a target once the target held it: from
// then on, evercert's publishers keep it while a leaf of it is served.
func (w *simWorld) adoptHad(hist *[]simBundle) map[string]bool {
	if w.adopt == nil {
		return nil
	}
	if hist == &w.ctb {
		return w.adopt.ctbHad
	}
	return w.adopt.targetHad
}

// adoptNeverHeld reports whether ca is the old rotator's and the target
// whose history is hist never held it (adoptHad).
func (w *simWorld) adoptNeverHeld(hist []simBundle, ca string) bool {
	if w.adopt == nil || !w.adopt.cas[ca] {
		return false
	}
	had := w.adopt.targetHad
	if len(w.ctb) > 0 && len(hist) > 0 && &hist[0] == &w.ctb[0] {
		had = w.adopt.ctbHad
	}
	return !had[ca]
}

// adoptPublished records the old rotator's CAs a publisher put in the
// target whose history is hist.
func (w *simWorld) adoptPublished(hist *[]simBundle, fps map[string]bool) {
	if w.adopt == nil {
		return
	}
	had := w.adoptHad(hist)
	for fp := range fps {
		if w.adopt.cas[fp] {
			had[fp] = true
		}
	}
}

// adoptStart sets up a new process of an adoption plan: it adopts
// cert-controller's layout, and its quiet period's jitter comes from the
// seed.
func (w *simWorld) adoptStart(cfg *Config) {
	if w.adopt != nil {
		cfg.Adopt = LayoutCertController
	}
}

// adoptStarted finishes a process of an adoption plan once it is made.
func (w *simWorld) adoptStarted(p *simProc, src *rand.Rand) {
	a := w.adopt
	if a == nil {
		return
	}
	fw := p.a.store.writer
	if a.noWriter {
		p.a.store.writer, p.a.issuer.writer = nil, nil
		return
	}
	fw.quiet.SetJitterSource(rand.New(rand.NewSource(src.Int63())).Float64)
	if a.noRetire {
		// Retirement disabled: a kept CA's retirement lies past any run.
		fw.retireIn = 1 << 62
	}
}

// oldRotatorCA makes the old rotator's next CA and leaf, in its layout.
func (w *simWorld) oldRotatorCA() (map[string][]byte, string) {
	a := w.adopt
	a.n++
	ca, err := pki.NewCA(pki.Request{CommonName: fmt.Sprintf("cert-controller-ca-%d", a.n), KeyType: pki.ECDSAP256, Now: w.now, Backdate: time.Hour, Lifetime: simOldLifetime})
	if err != nil {
		panic(err)
	}
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "sim.example", DNSNames: []string{"sim.example"}, KeyType: pki.ECDSAP256, Now: w.now, Backdate: time.Hour, Lifetime: simOldLifetime})
	if err != nil {
		panic(err)
	}
	fp := Fingerprint(ca.Cert)
	a.cas[fp] = true
	simNotAfter.Store(fp, ca.Cert.NotAfter)
	return map[string][]byte{"ca.crt": ca.CertPEM, "ca.key": ca.KeyPEM, corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM}, fp
}

// oldToolPins reports whether the old tool decided what a client of the
// caBundle target with the given lag trusts now: while its pods run, and
// for lag after they stopped. The simulator does not write its injection
// into the target's history, but it is there: cert-controller's
// ReconcileWH watches the Secret and every webhook configuration it
// injects, and on any change of either (its own rewrite, an evercert
// publisher's write of the caBundle) it writes the Secret's ca.crt, its
// current CA alone, into every caBundle (knative's webhook reconciler and
// cert-manager's cainjector do the same with their CA). While its pods
// run, no leaf but its own current CA's is sure to verify for those
// clients, whatever the replicas do: a holding replica's, a replica's
// that adopted a rewrite overwritten since, a replica's that started
// during the overlap. S1 and S2 leave the caBundle target to it then; A1
// judges that evercert's publishers publish its current CA meanwhile, and
// S1 and S2 judge the target again from the pods' end (what the replicas
// left behind). The bundle files and the ClusterTrustBundle, which it does
// not write, are judged throughout.
func (w *simWorld) oldToolPins(lag time.Duration) bool {
	a := w.adopt
	return a != nil && (w.oldRotatorRunning() || !a.stopped.IsZero() && w.now.Sub(a.stopped) < lag)
}

// oldRotatorRunning reports whether the old rotator's pods run now.
func (w *simWorld) oldRotatorRunning() bool {
	return w.adopt != nil && w.now.Before(w.adopt.until)
}

// oldrot is the fault: the old rotator's pods run for f.Dur.
func (w *simWorld) oldrot(f simFault) {
	a := w.adopt
	if a == nil {
		return // a plan that does not adopt has no old rotator
	}
	var answer, every time.Duration
	for _, part := range []struct {
		key string
		d   *time.Duration
	}{{"answer ", &answer}, {"every ", &every}} {
		if _, v, ok := strings.Cut(f.Arg, part.key); ok {
			*part.d, _ = time.ParseDuration(strings.Fields(v)[0])
		}
	}
	if !w.oldRotatorRunning() {
		a.runningSince = w.now
		w.parse()
		a.base = max(w.oldUnserved(), 1)
	}
	a.until = latest(a.until, w.now.Add(f.Dur))
	a.answer, a.every = answer, every
	w.at(a.until, func() {
		if !w.oldRotatorRunning() && !a.runningSince.IsZero() {
			a.runningSince, a.stopped = time.Time{}, w.now
			w.log("the old rotator's pods are gone")
		}
	})
	a.tickGen++
	if every > 0 {
		gen := a.tickGen
		var tick func()
		tick = func() {
			if gen != a.tickGen || !w.oldRotatorRunning() {
				return
			}
			w.oldRewrite("its own cadence")
			w.at(w.now.Add(every), tick)
		}
		w.at(w.now.Add(every), tick)
	}
	w.oldAnswer()
}

// oldAnswer queues the old rotator's answer to a Secret that lacks ca.key
// (an adoption, or a Secret written in evercert's layout).
func (w *simWorld) oldAnswer() {
	a := w.adopt
	if a == nil || a.answerQ || !w.oldRotatorRunning() || w.secret == nil {
		return
	}
	if _, ok := w.secret.Data["ca.key"]; ok {
		return
	}
	a.answerQ = true
	// Its reconcile comes a moment after the watch event.
	d := a.answer + time.Duration(a.rng.Intn(1000))*time.Millisecond
	w.at(w.now.Add(d), func() {
		a.answerQ = false
		if !w.oldRotatorRunning() || w.secret == nil {
			return
		}
		if _, ok := w.secret.Data["ca.key"]; ok {
			return
		}
		w.oldRewrite("an answer to the adoption")
	})
}

// oldRewrite is the old rotator's rewrite: a new CA and leaf over its keys
// of the Secret as read, every other key and annotation kept (an Update).
func (w *simWorld) oldRewrite(why string) {
	if w.secret == nil {
		return
	}
	a := w.adopt
	s := w.secret.DeepCopy()
	data, fp := w.oldRotatorCA()
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	for k, v := range data {
		s.Data[k] = v
	}
	s.ResourceVersion = w.nextRV()
	a.cur, a.curAt, a.curRV = fp, w.now, s.ResourceVersion
	clear(a.hadLeaf)
	for _, sl := range w.slots {
		if p := sl.proc; p != nil && w.alive(p) && p.leafSN != "" {
			a.hadLeaf[p] = true
		}
	}
	w.log("the old rotator rewrites the Secret (%s): CA %s", why, short(fp))
	w.setSecret(s)
}

// adoptSecretSet is told of every Secret stored: the old rotator answers
// one that lacks ca.key.
func (w *simWorld) adoptSecretSet() {
	if w.adopt != nil {
		w.oldAnswer()
	}
}

// adoptReplicaWrote records a replica's write of the Secret (A3).
func (w *simWorld) adoptReplicaWrote(s *corev1.Secret) {
	a := w.adopt
	if a == nil {
		return
	}
	st, _, err := parseSecretLayout(s, LayoutCertController)
	content := "unparsed"
	if err == nil {
		var b strings.Builder
		if st.signing != nil {
			b.WriteString(short(Fingerprint(st.signing.Cert)))
		}
		b.WriteString("/")
		if st.next != nil {
			b.WriteString(short(Fingerprint(st.next.Cert)))
		}
		fps := make([]string, 0, len(st.bundle))
		for _, c := range st.bundle {
			fps = append(fps, short(Fingerprint(c)))
		}
		slices.Sort(fps)
		b.WriteString("/" + strings.Join(fps, ","))
		content = b.String()
	}
	if w.logf != nil {
		w.log("a replica writes the Secret: %s", content)
	}
	if !a.anchorKnown && err == nil {
		a.anchorKnown = true
		if st.signing != nil && a.cas[Fingerprint(st.signing.Cert)] {
			a.anchor = Fingerprint(st.signing.Cert)
		}
	}
	a.writes = append(a.writes, w.now)
	a.contents = append(a.contents, content)
}

// adoptParse reads the Secret as the replicas of the plan do.
func (w *simWorld) adoptParse(s *corev1.Secret) (*caSet, error) {
	if w.adopt == nil {
		return parseAuthoritySecret(s)
	}
	st, _, err := parseSecretLayout(s, LayoutCertController)
	return st, err
}

// stillValidAdopt reports whether the old rotator's CA fp is one a
// publisher keeps in the target whose last content is last: its current
// one while its pods run, one the Secret holds, and one the replica that
// wrote last still announces (below). The others (replaced within an
// episode, trimmed, retired) are valid for years and trusted by nothing
// evercert serves.
func (w *simWorld) stillValidAdopt(fp string, last simBundle) bool {
	a := w.adopt
	if a == nil {
		return true
	}
	if r := w.secret; r != nil {
		if t, ok := parseRetirements(r)[fp]; ok && !w.now.Before(t) {
			return false
		}
	}
	if !a.cas[fp] {
		// One of evercert's. The trim after an overlap leaves out a
		// successor of ours that the old rotator's rewrite replaced and no
		// served leaf chains to (foreignWriter.kept), valid for its
		// lifetime: cabundle's publisher takes it out of the target once
		// no live replica announces a bundle that holds it (byOwnReplica),
		// not only at its end. Held to the rule above while the Secret
		// or a live replica's bundle holds it (a replica behind).
		return w.parsedCAs == nil || w.parsedCAs[fp] || w.liveBundleHolds(fp)
	}
	if fp == a.cur && w.oldRotatorRunning() {
		return true
	}
	// One the Secret holds, or one the publisher that wrote the target
	// last still holds, live and believed by its peers, after the old
	// rotator's rewrite replaced it in ca.crt (adopted during the overlap,
	// its leaves served): cabundle's publisher leaves the bundle a live
	// replica announces (byOwnReplica), so a replica back from a pause
	// that outlasted the overlap, holding its bundle from before it, does
	// not take that CA out (seed 656, S1). Only that writer's: a value
	// the old tool injected, or a bundle its writer no longer announces,
	// is overwritten.
	return w.parsedCAs != nil && w.parsedCAs[fp] || last.by >= 0 && w.announcesHolding(w.slots[last.by].proc, fp)
}

// announcesHolding reports whether p is a replica whose Lease its peers
// believe and whose bundle holds fp: live as S2 counts it (live), or
// running with a fresh Lease and a leaf of a CA of the bundle the
// Authority recorded before the old rotator's rewrite, which its peers
// believe too (replicaSet.setRoots) while ca.crt lacks it.
func (w *simWorld) announcesHolding(p *simProc, fp string) bool {
	if p == nil || !simFingerprints(p.a.CurrentCABundleContent())[fp] {
		return false
	}
	if w.live(p) {
		return true
	}
	if !w.alive(p) || w.paused(p) || !p.checked || p.leafSN == "" || !w.parsedRecorded[p.leafCA] {
		return false
	}
	l := w.leases[p.a.replicas.leaseName]
	return l != nil && l.Spec.RenewTime != nil && w.now.Add(p.slot.offset).Before(l.Spec.RenewTime.Add(simLease))
}

// liveBundleHolds reports whether the bundle of a live replica holds fp.
func (w *simWorld) liveBundleHolds(fp string) bool {
	for _, s := range w.slots {
		if p := s.proc; p != nil && w.live(p) && simFingerprints(p.a.CurrentCABundleContent())[fp] {
			return true
		}
	}
	return false
}

// checkAdopt judges the adoption invariants (A1, A2, A3) after an event.
func (w *simWorld) checkAdopt(clients []simClient) {
	a := w.adopt
	if a == nil || w.v != nil {
		return
	}
	running := w.oldRotatorRunning()
	// A1: while the old rotator's pods run, they serve a leaf of its
	// current CA: the clients that follow the published bundles trust it
	// within their lag and simHoldGrace, unless another fault stopped
	// every publisher of that bundle since the rewrite, and every live
	// replica that held since then publishes it in its own bundle.
	if running && !w.quietExOld.After(a.curAt) {
		since := w.now.Sub(a.curAt)
		for _, t := range []struct {
			name      string
			hist      []simBundle
			lag       time.Duration
			publishes func(*simSlot) bool
		}{
			{"caBundle target", w.target, 0, func(s *simSlot) bool { return s.publisher }},
			{"caBundle target", w.target, simTargetLag, func(s *simSlot) bool { return s.publisher }},
			{"ClusterTrustBundle", w.ctb, 0, func(s *simSlot) bool { return s.ctb }},
			{"ClusterTrustBundle", w.ctb, simCTBLag, func(s *simSlot) bool { return s.ctb }},
		} {
			if len(t.hist) == 0 || since < t.lag+simHoldGrace || !w.publishedThrough(t.publishes, a.curAt) {
				continue
			}
			if !trustAt(t.hist, w.now, t.lag)[a.cur] {
				w.fail("A1", "the old rotator's pods serve a leaf of its CA %s, written %v ago, which clients of the %s (lag %v) do not trust", short(a.cur), since, t.name, t.lag)
				return
			}
		}
		if since >= simHoldGrace {
			for _, s := range w.slots {
				p := s.proc
				if p == nil || !w.alive(p) || !a.hadLeaf[p] || w.paused(p) || p.slot.pausedUntil.After(a.curAt) || p.lastCheck.Before(a.curAt) {
					continue
				}
				if t := trustAt(s.file, w.now, 0); t != nil && !t[a.cur] && w.secret != nil && w.secret.ResourceVersion == a.curRV {
					w.fail("A1", "the old rotator's pods serve a leaf of its CA %s, written %v ago, which r%d's bundle file does not hold (r%d has read the rewrite)", short(a.cur), since, s.idx, s.idx)
					return
				}
			}
		}
	}
	// A2: while the old rotator rewrites, a live replica that read a
	// rewrite after it had a state in force says so (ForeignWriter,
	// Stalled) until the Secret has been left alone for a check interval
	// (the shortest quiet period), and ca.crt does not grow with the
	// rewrites.
	w.parse()
	if running {
		if n := w.oldUnserved(); n > a.base+simAdoptGrowth {
			w.fail("A2", "ca.crt holds %d of the old rotator's CAs that no live replica serves a leaf of while it rewrites the Secret (%d when it started): an adoption per rewrite", n, a.base)
			return
		}
	}
	if running && w.secret != nil && w.secret.ResourceVersion == a.curRV && w.now.Sub(a.curAt) < simCheck-2*simSkew {
		for _, s := range w.slots {
			p := s.proc
			if p == nil || !w.alive(p) || !a.hadLeaf[p] || w.paused(p) || p.lastCheck.Before(a.curAt) || !p.checked || w.opsPending(p) {
				continue
			}
			o, ok, _ := p.store.GetByKey(simNamespace + "/" + simSecret)
			if !ok || o.(*corev1.Secret).ResourceVersion != a.curRV || p.lastCheck.Before(p.delivered["secret"]) {
				continue // its last check did not read the rewrite
			}
			if st := p.a.Status(); st.ForeignWriter == "" || !st.Stalled {
				w.fail("A2", "r%d read the old rotator's rewrite (CA %s, %v ago) after it had a state in force and does not report it (ForeignWriter %q, Stalled %v, phase %s)",
					s.idx, short(a.cur), w.now.Sub(a.curAt), st.ForeignWriter, st.Stalled, st.Phase)
				return
			}
		}
	}
	// A3: once the old rotator stopped and nothing else happened for
	// simAdoptSettle, ca.crt holds at most simAdoptBundle CAs besides the
	// ones live replicas serve leaves of and the anchor, and the replicas do not write
	// the Secret back and forth.
	if running || a.stopped.IsZero() {
		a.writes, a.contents = a.writes[:0], a.contents[:0]
		return
	}
	from := latest(a.stopped, w.quietSince).Add(simAdoptSettle)
	if w.now.Before(from) || w.secret == nil || w.parsedCAs == nil {
		a.writes, a.contents = a.writes[:0], a.contents[:0]
		return
	}
	if !a.settledJudged {
		a.settledJudged = true
		w.stats.adoptSettled++
	}
	served := map[string]bool{}
	for _, s := range w.slots {
		if w.live(s.proc) {
			served[s.proc.leafCA] = true
		}
	}
	var extra []string
	for fp := range w.parsedCAs {
		if !served[fp] && fp != a.anchor {
			extra = append(extra, short(fp))
		}
	}
	if len(extra) > simAdoptBundle {
		slices.Sort(extra)
		w.fail("A3", "ca.crt holds %d CAs no live replica serves a leaf of (%s), %v after the old rotator stopped and %v after the last fault", len(extra), strings.Join(extra, " "), w.now.Sub(a.stopped), w.now.Sub(w.quietSince))
		return
	}
	for i := range a.contents {
		if i >= 2 && a.contents[i] != a.contents[i-1] && slices.Contains(a.contents[:i-1], a.contents[i]) {
			w.fail("A3", "replicas write the Secret back and forth after the overlap settled: write %d of %d puts back content written before", i+1, len(a.contents))
			return
		}
	}
	n := 0
	for _, t := range a.writes {
		if w.now.Sub(t) < simLifetime {
			n++
		}
	}
	if n > simAdoptWrites {
		w.fail("A3", "replicas wrote the Secret %d times within %v after the overlap settled", n, simLifetime)
	}
}

// opsPending reports whether the Secret carries an operator's request not
// acted on yet or an emergency not over for p (operatorRequests.pending,
// with the state p has in force): p acts on it at once and does not hold
// on a rewrite that keeps it.
func (w *simWorld) opsPending(p *simProc) bool {
	if w.secret == nil {
		return false
	}
	st, err := w.adoptParse(w.secret)
	return err == nil && parseOperatorRequests(w.secret).pending(st, p.a.store.last)
}

// oldUnserved counts the old rotator's CAs in ca.crt that no live
// replica serves a leaf of (A2).
func (w *simWorld) oldUnserved() int {
	n := 0
	for fp := range w.parsedCAs {
		if w.adopt.cas[fp] && !slices.ContainsFunc(w.slots, func(s *simSlot) bool { return w.live(s.proc) && s.proc.leafCA == fp }) {
			n++
		}
	}
	return n
}

// publishedThrough reports whether a publisher of a bundle has run since
// t without a fault that stops it publishing: running since then (not
// restarted), never paused or cut off from the API meanwhile, and no
// other fault in force (quietExOld, checked by the caller).
func (w *simWorld) publishedThrough(publishes func(*simSlot) bool, t time.Time) bool {
	for _, s := range w.slots {
		p := s.proc
		if !publishes(s) || p == nil || !w.alive(p) || p.started.After(t) || w.paused(p) || s.pausedUntil.After(t) || !w.now.Before(s.pubDownUntil) || w.apiDown(s.idx) {
			continue
		}
		return true
	}
	return false
}

// simAdoptRegressions are the shrunk schedules of adoption plans that broke
// an invariant (as simRegressions, read by parseSimPlanAdopt): each must
// run clean now.
var simAdoptRegressions = []struct {
	found string
	plan  string
}{
	{"A2: after a finished emergency the records it left on the Secret (the mark, handled; the successor) made every later rewrite of the old rotator evercert's, adopted at once, one CA more in ca.crt each (foreignWriter.rewritten: only a request not acted on, or records this process does not have in force)",
		"seed 4: 2 replicas, publishers [], 40m0s CAs, 2 faults, adopting cert-controller's Secret\n5m0s compromise\n19m12s oldrot for 15m0s answer 13s every 3m24s"},
	{"A2: after a handled rotation request the same (rotate-requested and its handled record stay on the Secret)",
		"seed 4: 2 replicas, publishers [r0], 40m0s CAs, 2 faults, adopting cert-controller's Secret\n5m0s rotate\n12m0s oldrot for 15m0s answer 5s"},
	// A replica that starts while the old rotator writes (a restart, a
	// rollout: the rolling update itself) adopts the rewrite it reads
	// first, with no state of its own, and writes ca.crt with the old
	// rotator's CA alone, taking out the CA its live peers serve leaves
	// of (announced in their Leases) until they write it back at their
	// adoption. While the old pods run the old tool itself keeps the
	// caBundle to its current CA alone (oldToolPins), so the same clients
	// fail whatever the replicas do; these two ran clean once S1 left the
	// caBundle to it while its pods run (the peers' adoption wrote the CA
	// back before they stopped).
	{"S1: a replica restarted during the overlap adopted the rewrite alone and its publisher took the CA a holding peer serves out of the caBundle, while the old tool's pods ran",
		"seed 208: 2 replicas, publishers [r0], 40m0s CAs, 2 faults, adopting cert-controller's Secret\n0s oldrot for 13m0s answer 24s\n52s kill r0 for 33s"},
	{"S1: the same through a rollout",
		"seed 94: 3 replicas, publishers [r1 r2], 1h20m0s CAs, 2 faults, adopting cert-controller's Secret\n13s oldrot for 7m0s answer 28s\n1m28s rollout for 6m12s x3"},
	{"A2: a compromised mark made while the only replica was paused, its CA replaced by the old rotator's rewrite before the replica read it: the emergency ignores it, never records it handled, and counted as pending it made every later rewrite evercert's, adopted at once (operatorRequests.pending: only a mark on a CA of the Secret or of the state in force)",
		"seed 694: 1 replicas, publishers [], 40m0s CAs, 3 faults, adopting cert-controller's Secret\n17m33s pause r0 for 7m26s\n20m43s compromise\n21m40s oldrot for 15m0s answer 17s"},
	{"A2: a rollout during the overlap: each new pod adopted the rewrite it read first and learned its predecessors' CAs from a peer's write only, so every trim kept them as evercert's own (foreignWriter: the other writer's CAs are named in OtherWriterCAsAnnotation)",
		"seed 320: 3 replicas, publishers [r0 r1 r2], 40m0s CAs, 2 faults, ClusterTrustBundle [r0 r2], adopting cert-controller's Secret\n0s oldrot for 8m0s answer 12s\n5m15s rollout for 1m1s x2"},
	{"A2: the same with the old rotator also rewriting on a cadence of its own",
		"seed 11: 3 replicas, publishers [r1 r2], 40m0s CAs, 2 faults, adopting cert-controller's Secret\n15m28s oldrot for 12m0s answer 27s every 49s\n16m30s rollout for 3m16s x6"},
	{"A3: the old rotator's CA adopted at the end of the overlap signed until evercert's successor replaced it, then stayed in ca.crt until it expired, ten years (foreignWriter.retireReplaced)",
		"seed 52: 3 replicas, publishers [r0 r1], 1h20m0s CAs, 5 faults, CA keys in a key store, adopting cert-controller's Secret\n0s oldrot for 1m0s answer 16s\n3m28s stop r0 for 4m44s new-id\n12m1s kill r1 for 9m35s new-id\n35m11s rotate\n51m8s rotate"},
	// A replica that starts with no state reads the old rotator's
	// rewrite as its first state: it adopted it alone, and wrote and
	// published a bundle without the CA a holding peer serves a leaf of
	// (its Lease announces it). Fixed by the record of the written bundle
	// (WrittenBundleAnnotation, trustRecorded;
	// TestForeignWriterRestartedPeerKeepsHoldingPeersCA).
	{"S1: a replica restarted after the old pods stopped adopted their last rewrite alone and its publisher took the CA a holding peer serves out of the caBundle",
		"seed 1049: 2 replicas, publishers [r0 r1], 40m0s CAs, 2 faults, adopting cert-controller's Secret\n0s oldrot for 7m0s answer 2s\n4m44s kill r0 for 3m17s"},
	{"S1: the same during the overlap on a ClusterTrustBundle, which no old tool writes",
		"seed 286: 2 replicas, publishers [r1], 40m0s CAs, 2 faults, ClusterTrustBundle [r0], adopting cert-controller's Secret\n4m20s oldrot for 13m0s answer 9s\n9m8s rollout for 4m23s x8"},
	{"S1: a replica restarted during a pause that outlasted the overlap took the CA its peers serve from the record at its first check, but its clock skew hold (waiting for the peers' renewals) kept the Secret as read in force, and its first write once the hold ended put ca.crt out without that CA (trustRecorded: a skew hold's state counts as none)",
		"seed 656: 3 replicas, publishers [r1 r2], 1h20m0s CAs, 4 faults, adopting cert-controller's Secret\n18m45s oldrot for 15m0s answer 27s\n21m27s pause r2 for 20m44s\n28m21s oldrot for 13m0s answer 10s\n34m37s stop r2 for 1m10s new-id"},
	{"S1: a replica paused through the overlap came back holding its bundle from before it, and the simulator's publisher let it take out of the caBundle the CA its peers adopted meanwhile and serve leaves of, which the old rotator's last rewrite had replaced in ca.crt (a model gap: cabundle leaves the bundle a live replica announces, byOwnReplica, and its peers believe a leaf of a recorded CA)",
		"seed 656: 3 replicas, publishers [r1 r2], 1h20m0s CAs, 2 faults, adopting cert-controller's Secret\n21m27s pause r2 for 20m44s\n28m21s oldrot for 13m0s answer 10s"},
	{"L1: the trim after the overlap left out the successor made at the adoption (a key store: the adopted CA's key was in the Secret), still valid, and the simulator's publishers refused every later bundle without it, so no successor was observed and every replica stalled (a model gap: cabundle writes over a value no live replica announces)",
		"seed 1171: 3 replicas, publishers [r0 r1 r2], 1h20m0s CAs, 1 faults, CA keys in a key store, adopting cert-controller's Secret\n0s oldrot for 5m0s answer 3s"},
	// Shrunk from the full seeds with a predicate of both builds (A2
	// before the fleet's anchor, clean after it): the simulator's own
	// shrink of these seeds kept only "A2", and landed on plans that fail
	// for another cause (a replica that never read a rewrite writes back,
	// machine.restore, the unserved CAs a new pod's first adoption left
	// out).
	{"A2: a rollout pod that started during the overlap took the rewrite it adopted first for its anchor, never named it as the old rotator's (OtherWriterCAsAnnotation), and the pods after it kept it as evercert's own (the fleet's anchor: AnchorCAAnnotation)",
		"seed 450: 4 replicas, publishers [r0 r1 r3], 40m0s CAs, 5 faults, CA keys in a key store, adopting cert-controller's Secret\n0s oldrot for 4m0s answer 25s every 44s\n9m50s compromise\n11m19s api r0 for 6m52s *:*:429\n13m34s rollout for 3m8s x5\n18m39s oldrot for 14m0s answer 10s"},
	{"A2: the same with twelve rollouts of six replicas during the overlap",
		"seed 1680: 6 replicas, publishers [r0 r3 r5], 1h0m0s CAs, 3 faults, ClusterTrustBundle [r0 r1 r2 r3 r4 r5], adopting cert-controller's Secret\n4m1s slow r0 for 10m9s secrets:update:timeout\n7m6s rollout for 43s x12\n7m42s oldrot for 12m0s answer 23s"},
	// A holding replica whose reads of the Secret failed or were slow
	// missed a peer's adoption (the trim, or an operator's request) and
	// read the old rotator's answer to it: its hold served its state and
	// the old rotator's current CA only, so the CA the peer adopted left
	// its bundle and the targets it publishes while its Lease still
	// announced it (foreignWriter.peersRecordedLocked;
	// TestForeignWriterHoldKeepsCAPeerAdoptedUnread).
	{"S2: a replica whose calls timed out missed its peer's adoption after the overlap, and its hold took the adopted CA out of the caBundle target before the peer's first leaf of it",
		"seed 1893: 2 replicas, publishers [r1], 40m0s CAs, 3 faults, CA keys in a key store, adopting cert-controller's Secret\n0s oldrot for 1m0s answer 28s\n0s oldrot for 7m0s answer 10s\n3m1s slow r1 for 3m19s *:*:timeout"},
	{"S2: the same on a ClusterTrustBundle, a replica's key store hanging its checks",
		"seed 1397: 2 replicas, publishers [], 40m0s CAs, 3 faults, CA keys in a key store, ClusterTrustBundle [r0], adopting cert-controller's Secret\n5m38s compromise\n7m44s oldrot for 10m0s answer 7s\n8m33s keys r0 for 29m56s hang"},
	{"S2: the same through a second window of the old rotator's pods",
		"seed 1801: 3 replicas, publishers [], 40m0s CAs, 3 faults, CA keys in a key store, ClusterTrustBundle [r0 r1], adopting cert-controller's Secret\n0s oldrot for 6m0s answer 29s\n7m49s oldrot for 2m0s answer 27s every 2m45s\n8m15s keys r0 for 17m19s hang"},
	{"S1: the same with the only caBundle publisher's key store failing: its hold took the CA its peers adopted out of the caBundle, which lacked it once the old pods were gone",
		"seed 786: 3 replicas, publishers [r1], 40m0s CAs, 3 faults, CA keys in a key store, adopting cert-controller's Secret\n5m28s rotate\n18m42s oldrot for 4m0s answer 8s\n19m19s keys r1 for 21m56s fail"},
	{"S1: the same, and an operator's rotation request then made the peer adopt the next rewrite while it still served a leaf of the CA it adopted before: the hold served only the CA the Secret names as signing, and took the served one out of the ClusterTrustBundle (the recorded CAs a peer serves leaves of are served too)",
		"seed 1397: 2 replicas, publishers [], 40m0s CAs, 4 faults, CA keys in a key store, ClusterTrustBundle [r0], adopting cert-controller's Secret\n5m38s compromise\n7m44s oldrot for 10m0s answer 7s\n8m33s keys r0 for 29m56s hang\n15m9s rotate"},
	// The hold's reason was cleared once the quiet period was over, before
	// the adoption was written; its write conflicting, the replica said
	// nothing for up to a check interval (a conflict streak is reported
	// once it outlasts one), diverged from the Secret since the hold
	// began (foreignWriter.decide; TestForeignWriterStalledUntilAdoptionWritten).
	{"V1: the adoption that ended a hold kept conflicting, and the replica, in force with another CA than the Secret's for the whole hold, said nothing while the conflict streak was shorter than a check interval",
		"seed 1434: 1 replicas, publishers [r0], 1h20m0s CAs, 2 faults, adopting cert-controller's Secret\n6m21s oldrot for 5m0s answer 12s every 1m37s\n8m13s api r0 for 10m7s secrets:update:409"},
	// A pod of a rolling update that started on the old rotator's rewrite
	// trusted only the recorded CAs a peer announced a leaf of, not the one
	// the Authority's last write signed with, which its peer then signed
	// with while it held (trustRecorded;
	// TestForeignWriterRestartedPeerTrustsRecordedSigningCA).
	{"S1: a replica rolled out during the overlap published a bundle without the CA its peer's write had adopted after an operator's rotation request, and the peer's next leaf of it failed the caBundle's clients once the old pods were gone",
		"seed 129: 2 replicas, publishers [r0 r1], 1h0m0s CAs, 4 faults, adopting cert-controller's Secret\n16m56s oldrot for 12m0s answer 21s every 44s\n22m32s rollout for 6m32s x1\n22m51s api r0 for 3m14s secrets:update:409\n24m2s rotate"},
}

// TestSimulateAdoptRegressions replays every schedule in
// simAdoptRegressions.
func TestSimulateAdoptRegressions(t *testing.T) {
	simQuietLogs(t)
	for _, r := range simAdoptRegressions {
		plan, err := parseSimPlanAdopt(r.plan)
		if err != nil {
			t.Fatalf("%s: %v", r.found, err)
		}
		if !plan.Adopt || !strings.HasPrefix(plan.String(), strings.SplitN(r.plan, "\n", 2)[0]) {
			t.Fatalf("%s: the plan reads back as %q", r.found, plan)
		}
		if v, _ := simRun(plan, "", nil); v != nil {
			t.Errorf("%s\n  %v\n  replay: %s", r.found, v, plan)
		}
	}
}
