package authority

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certreport"
)

// foreignWriter is the part of the rotation machine (machine.step) that
// tells the rotator an Authority adopted from (Config.Adopt) still writing
// the Secret: a rolling update straight from the old tool's pods to
// evercert's keeps the old pods rotating while the new ones start. A
// foreign rewrite is a read of the Secret in the adopted layout whose
// signing CA this process never had in force, after it adopted or wrote
// the Secret (it has a last state). Adopting each one, as any adoption
// does, fights the old rotator (OPA cert-controller regenerates its CA as
// soon as the Secret lacks ca.key, that is, at once after each adoption)
// and keeps every CA it made in ca.crt until it expires (ten years at
// cert-controller's defaults): issue 27 saw 333 of them.
//
// While the rewrites go on (hold), the replica adopts nothing and writes
// nothing: it keeps serving the state it had in force, with one CA added to
// the bundle it publishes: the old rotator's CA now in the Secret, which
// its pods serve leaves of (and which it injects into the caBundles
// itself), so that a caBundle publisher of this replica's never takes that
// trust away from them while they still serve. Only the current one is
// added, never one per rewrite; and, when a peer adopted a rewrite that
// this replica never read (the Secret's record of the Authority's last
// write names it: peersRecordedLocked), the CA that peer signs with and
// the recorded CAs a peer serves leaves of. It reports Stalled with the reason
// (RotationStatus.ForeignWriter), sends one Warning Event per episode and
// counts every rewrite (evercert_ca_secret_foreign_rewrites_total), but it
// keeps the ca-rotation readiness check green while it serves a valid leaf:
// the hold comes from the old pods of a rolling update, and that update
// replaces them only once the new pods are Ready. Failing readiness here
// would keep every new pod NotReady, so the old pods, and the old rotator
// in them, would never go away (a review of the first attempt found that
// deadlock). The check fails only when no valid leaf is served
// (RotationStatus.LeafExpired).
//
// Only a foreign writer's rewrite is held, never evercert's own state
// (rewritten): a Secret that carries an operator's request not acted on
// yet (a compromised CA, a rotation request) or an emergency not over is
// always decided at once, so an emergency never waits for a hold
// (machine.step runs the emergency on it); a handled one, which stays on
// the Secret and which the old rotator's Update keeps, does not end the
// holds (operatorRequests.pending). In the cert-manager layout, which is
// the Authority's own, a Secret whose WrittenCAAnnotation names its
// signing CA is taken for a peer's write: a paused replica that missed a peer's emergency (one CA in
// tls.crt and ca.crt, as cert-manager writes) must follow it, not serve
// the compromised CA it had (a review found the first attempt doing that),
// and a peer's recreation of a deleted Secret is no old rotator. The
// annotation is on every write of the Authority's, announcements or not,
// and cert-manager's webhook keeps it while it replaces tls.crt, so its
// rewrite names another CA and is held. The other layouts are never
// written by an Authority, so their data alone name the writer.
//
// The rewrites have stopped once the Secret has held the same foreign CA
// for a quiet period on this process's clock: one check interval for an
// episode that starts long after the last one. A stopped writer is told
// apart from a running one that is between two rewrites only by waiting; a
// longer wait (the propagation delay, days) would keep every replica
// serving the overlap's state, Stalled, long after the old pods are gone,
// and a shorter one (the API latency) is the fight this prevents. A rotator that still runs after
// that (it rotates only on its own schedule, or it answers the adoption
// with a rewrite, as cert-controller does) starts a new episode, and each
// such adoption costs its pods a CA swap (cert-controller injects its new
// CA alone), so the quiet period backs off (internal/backoff: doubling,
// jittered, up to ten check intervals) while episodes follow each other
// within that cap; no CA piles up meanwhile (below).
//
// Then the replica adopts once (trim). It trims only the CAs the other
// writer wrote (episode: the ones this process read in its layout, its
// first adoption's included, and those a peer's write names as the other
// writer's: OtherWriterCAsAnnotation) that no served leaf chains to; every other CA
// of the Secret as it stood before the episode stays, as evercert's own
// CAs always do until they expire. Kept, of the other writer's CAs: the
// adopted one (which signs, and which the old rotator's last leaf chains
// to: its pods may serve that leaf until they are gone), this replica's
// current, previous and successor CAs (the CA of the leaf it serves, the
// one it signed with before the episode, its successor), and every CA a
// live peer's Lease announces a served leaf of (replicaSet.servingFrom).
// Without announcements (Config.DisableReplicaAnnouncements) a peer's leaf
// is unknown, so every CA the Secret had before the episode stays too: a
// peer that adopted one of them (its first read was a rewrite) or that is
// slow to follow serves a leaf of it, and a review found the first rule
// (keep only this replica's serving CA) dropping that CA, the peer's
// clients then failing with "x509: certificate signed by unknown
// authority". This is the simplest rule that is safe: a CA leaves only
// when nothing evercert knows of serves a leaf of it, and the other
// writer's CAs are the only ones an overlap adds. With announcements, a
// run of episodes (cert-controller answers each adoption with a new CA)
// leaves ca.crt the adopted CA plus the served ones, three at most
// (current, successor, previous); without them, one more per episode,
// until those expire. With announcements, the other writer's CAs kept only
// for a leaf served then leave a leaf lifetime and a check interval later
// (retireKept, machine.retire), as does, after an overlap, one of them
// that signed here once a rotation of evercert's replaced it
// (retireReplaced), and a successor of ours that a rewrite
// replaced is left out unless a peer announces a leaf of it: the old
// rotator's CAs are valid for years, and nothing signs with them after the
// trim. "A peer announces" counts a Lease that expired but is not yet
// collected (replicaSet.announces), and the anchors are always kept: the
// CA adopted when the migration began (origin, the fleet's: every write
// records it, AnchorCAAnnotation) and the CA this process signed with when
// its first episode began (anchor) unless that is one of the other
// writer's and origin is known. A replica cut off from the API server
// renews from the CA in its memory, and a review found both rules dropping
// that CA under it. What no rule can see: a peer that
// adopted a CA this process never read, and a peer cut off after it adopted
// a CA during the overlap for longer than its Lease is kept. Either writes
// the CA back at its next read (machine.restore).
//
// A replica that reads the adoption another replica wrote keeps the same
// rule. Every CA the trim leaves out is remembered as trimmed until it
// expires: a backup restored from the overlap that brings one back as the
// signing CA is a rollback (machine.restore), so that CA never signs
// again; the clients were given the trimmed bundle and do not trust it (a
// review found leaves of such a CA failing with "x509: certificate signed
// by unknown authority").
//
// The memory a hold keeps is bounded whatever the other writer does (a
// review found a hold that never ends keeping one certificate per
// rewrite): the last maxForeignCAs CAs it wrote, and at most
// maxTrimmedCAs trimmed fingerprints.
type foreignWriter struct {
	name, key string
	layout    SecretLayout
	report    *reporter
	// quiet hands out the quiet period of each episode; see above.
	quiet *backoff.Backoff
	// retireIn is how long after a trim a leaf signed with a CA the trim
	// kept for it can still be served: the leaf lifetime (this replica's
	// last leaf of it was signed before the trim) and a check interval (a
	// peer renewing from the CA in its memory during its own hold reads
	// the trim within one). A live peer that still serves one keeps the CA
	// longer (machine.retire).
	retireIn time.Duration

	mu sync.Mutex
	// seen is the fingerprint of the foreign CA last read, since when this
	// process first read it.
	seen  string
	since time.Time
	// active: an episode goes on (held, or adopting after it until a
	// check settles).
	active bool
	// wait is the current episode's quiet period; adopted is when the
	// last episode ended in an adoption.
	wait    time.Duration
	adopted time.Time
	// why is the Stalled reason while held, "" otherwise.
	why string
	// episode holds the other writer's CAs this process read (in the
	// adopted layout, or named in OtherWriterCAsAnnotation), the last
	// maxForeignCAs of them, oldest first: not
	// reset when an episode ends, so the trim after the next one of the
	// same overlap knows the CAs the one before adopted for the other
	// writer's. trimmed maps the fingerprint of each CA a trim left out to
	// its NotAfter (forgotten after it; at most maxTrimmedCAs).
	episode []*x509.Certificate
	trimmed map[string]time.Time
	// anchor is the CA this process signed with when the first episode it
	// saw began: what a replica cut off from the API server since before
	// the overlap renews its leaves from, for as long as the cut lasts,
	// with no Lease that says so once its Lease is collected. Every trim
	// keeps it, and it is never retired: it stays until it expires, as the
	// CA of any adoption does (docs/migrating.md). Not one of the other
	// writer's CAs other than origin once origin is known: a pod that
	// started during the overlap signs with the rewrite it adopted first,
	// and took it for its anchor, kept for its ten years, one CA more in
	// ca.crt per pod of a rolling update (the simulator's A2).
	anchor *x509.Certificate
	// origin is the fleet's anchor: the CA adopted when the migration
	// began (this process's first read of a Secret no Authority had
	// written), or the one AnchorCAAnnotation names, the first this
	// process read. Kept and never retired, as anchor is; a later hand
	// edit of the annotation does not replace it (it only adds, for the
	// processes that read it, a CA kept longer).
	origin *x509.Certificate
	// overlapSeen: this process read the other writer's rewrite of a
	// Secret the Authority had written (a hold, or a first read whose
	// WrittenCAAnnotation names another CA): its own evidence of an
	// overlap, which retireReplaced needs (an annotation a hand edit can
	// change is not enough: review43b).
	overlapSeen bool
}

// maxForeignCAs bounds foreignWriter.episode. The list serves the trim
// only: a CA of the other writer's that the trim does not know of is kept
// (it is evercert's, as far as the trim can tell), never dropped, so a
// CA forgotten here costs ca.crt a CA, not a client its trust. Sixteen
// covers every CA of a rolling update's overlap that a replica can still
// serve or have in its bundle: the Secret held before the episode (one
// adoption ago, or one per episode without announcements) and the few a
// replica starting during the hold adopts on its first read; the hold
// serves the other writer's current CA only, never one per rewrite.
const maxForeignCAs = 16

// maxTrimmedCAs bounds foreignWriter.trimmed: one trim records at most
// maxForeignCAs of the other writer's CAs and the few of its own state, so
// four trims' worth. When it is full the CA that expires first is
// forgotten: a backup that brings a forgotten CA back is then adopted as
// another writer's CA (held, then adopted with the CA in ca.crt), not
// refused as a rollback.
const maxTrimmedCAs = 4 * maxForeignCAs

// foreignWriterHold is step's answer while another writer keeps rewriting
// the Secret: nothing is decided or written, and the check is due again
// after retryIn.
type foreignWriterHold struct {
	reason  string
	retryIn time.Duration
	// serve is the state to serve meanwhile: the last one in force, its
	// bundle with the other writer's current CA.
	serve *caSet
}

func (h *foreignWriterHold) Error() string { return h.reason }

// knows reports whether c is a CA of st (signing, successor or bundle).
func (st *caSet) knows(c *x509.Certificate) bool {
	return st.signing != nil && st.signing.Cert.Equal(c) || st.next != nil && st.next.Cert.Equal(c) || containsCert(st.bundle, c)
}

// rewritten reports whether the Secret as read is a foreign rewrite: in
// the adopted layout, with a signing CA this process never had (nor
// trimmed: that is a rollback, restore's), after it had a state in force,
// and with no mark of evercert's own. Anything else is the Authority's own
// state (its own write, a peer's adoption or emergency, an operator's
// request), this process's first adoption, or a rollback to content it
// knew.
func (w *foreignWriter) rewritten(in stepInput) bool {
	st := in.read
	if in.last == nil || st.signing == nil || in.last.knows(st.signing.Cert) || w.wasTrimmedLocked(st.signing.Cert, in.now) {
		return false
	}
	if st.ops.pending(st, in.last) {
		// An operator's request or an emergency not over yet, in any
		// layout: acted on at once, whatever the old rotator does. A
		// handled one stays on the Secret and does not count (pending).
		return false
	}
	if w.layout == LayoutCertManager {
		// cert-manager's layout is the Authority's: its DynamicAuthority's
		// rewrite is a new CA written to tls.crt and to ca.crt alone
		// (other keys and the annotations stay), which an Authority never
		// writes (its ca.crt keeps every CA still trusted) but after an
		// emergency or a retirement that a paused replica missed, or when
		// a peer recreates a deleted Secret. Each write of the Authority's
		// names the CA it wrote to tls.crt (WrittenCAAnnotation), whether
		// or not replicas announce themselves: a Secret whose signing CA
		// it names is a peer's (a review found a peer's recreation, with
		// announcements off and so no annotation, held as cert-manager's
		// rewrite); one that names another CA was rewritten since by
		// someone else. A Secret without it was written before the
		// annotation existed: any evercert.io annotation makes it a
		// peer's, as before.
		ours := len(in.marks) > 0
		if in.written != "" {
			ours = in.written == Fingerprint(st.signing.Cert)
		}
		return !ours && len(st.bundle) == 1 && st.bundle[0].Equal(st.signing.Cert)
	}
	// The other layouts are never the Authority's: the data were written
	// by the other rotator, whatever annotations its update kept.
	return in.adopted
}

// decide says whether this read is held (a foreign rewrite less than quiet
// ago), and else whether it ends an episode (trim: keep only the CAs a
// served leaf needs).
func (w *foreignWriter) decide(in stepInput) (hold *foreignWriterHold, trim bool) {
	if w == nil {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st := in.read
	if st.signing != nil && (in.adopted || w.layout == LayoutCertManager && in.last == nil && in.written == "" && len(in.marks) == 0) {
		// In the other rotator's layout: its CA, this process's first
		// adoption's too (the trim may leave it out once nothing serves a
		// leaf of it, or retire it once every leaf of it has expired).
		// cert-manager's layout is the Authority's own, so no read of it is
		// a conversion: a first read that no evercert write marked (no
		// WrittenCAAnnotation, no evercert.io annotation) is cert-manager's
		// CA adopted (a review found it in ca.crt until it expired, never
		// retired).
		w.rememberLocked(st.signing.Cert)
		if w.origin == nil && in.last == nil && in.written == "" && len(in.marks) == 0 && st.signing.Key != nil {
			// No Authority wrote this Secret: the migration begins
			// here, with this CA (AnchorCAAnnotation). Only a CA
			// adopted with its key: a replica cut off renews from the
			// anchor, and knative's CA comes without one (its leaf is
			// served until evercert's own CA signs), so nothing renews
			// from it and it leaves as any of the old tool's CAs
			// (make test-migrate, TestMigrateFromKnativeWhileItRotates).
			w.origin = st.signing.Cert
		}
	}
	if in.adopted && st.signing != nil && in.written != "" && in.written != Fingerprint(st.signing.Cert) {
		w.overlapSeen = true
	}
	if !w.rewritten(in) {
		return nil, w.active
	}
	w.overlapSeen = true
	now := in.now
	fp := Fingerprint(st.signing.Cert)
	if fp != w.seen {
		w.seen, w.since = fp, now
		w.rememberLocked(st.signing.Cert)
		certmetrics.ForeignRewrite(w.name)
		if !w.active {
			if w.adopted.IsZero() || now.Sub(w.adopted) >= w.quiet.Cap() {
				w.quiet.Reset() // not an answer to the last adoption
			}
			w.wait = w.quiet.Next(nil)
		}
		w.why = fmt.Sprintf("another writer keeps rewriting CA secret %s in the %s layout (CA %q, read at %s) after this Authority adopted it: the old rotator still runs; "+
			"serving the last good content and adopting nothing until the Secret is left alone for %v",
			w.key, w.layout, st.signing.Cert.Subject.CommonName, now.UTC().Format(time.RFC3339), w.wait.Round(time.Second))
		if !w.active {
			w.active = true
			if w.anchor == nil && in.last.signing != nil && (w.origin == nil || !containsCert(w.episode, in.last.signing.Cert)) {
				// Once the fleet's anchor is known (origin), one of the
				// other writer's CAs is never this process's own anchor:
				// it signs here because this process started during the
				// overlap and adopted a rewrite (see anchor).
				w.anchor = in.last.signing.Cert
			}
			if in.last.signing != nil && !w.anchoredLocked(in.last.signing.Cert) {
				// The CA that signed during the overlap, since an
				// adoption the old tool answered (its own, or one of
				// ours: knative's CA has no key, so each round makes one
				// of ours sign): kept while served, then retired, like
				// the old tool's (a run on the real kube-apiserver kept
				// one of ours per round until it expired).
				w.rememberLocked(in.last.signing.Cert)
			}
			klog.Background().Info("Another writer keeps rewriting the CA secret; holding", "provider", w.name, "secret", w.key, "layout", string(w.layout), "caSerial", serial(st.signing.Cert))
			w.report.Event(corev1.EventTypeWarning, dynamiccert.ReasonForeignCASecretWriter, certreport.ActionLoad,
				fmt.Sprintf("CA secret %s: %s. Stop the old rotator (remove it from the old pods, or scale them down).", w.key, w.why))
		} else {
			klog.Background().V(2).Info("CA secret rewritten by another writer again", "provider", w.name, "secret", w.key, "caSerial", serial(st.signing.Cert))
		}
	}
	if left := w.since.Add(w.wait).Sub(now); left > 0 {
		serve := in.last.clone()
		serve.bundle = slices.Clone(serve.bundle)
		if !containsCert(serve.bundle, st.signing.Cert) && !mutations.holdOmitsForeignCA {
			serve.bundle = append(serve.bundle, st.signing.Cert)
		}
		for _, c := range w.peersRecordedLocked(in) {
			if !containsCert(serve.bundle, c) {
				serve.bundle = append(serve.bundle, c)
			}
		}
		return &foreignWriterHold{reason: w.why, retryIn: left, serve: &serve}, false
	}
	// Stalled until the adoption is in force (settled): the state in force
	// still differs from the Secret's, and a write of the adoption that
	// conflicts is reported only once the streak outlasts a check interval
	// (issuer.check), so clearing the reason here left a replica that had
	// diverged for the whole hold saying nothing meanwhile (the simulator,
	// seed 1434, V1).
	w.why = fmt.Sprintf("the other writer has left CA secret %s alone for %v (CA %q, read at %s): adopting it once, serving the last good content until that adoption is written",
		w.key, w.wait.Round(time.Second), st.signing.Cert.Subject.CommonName, w.since.UTC().Format(time.RFC3339))
	return nil, true
}

// peersRecordedLocked returns the CAs of the bundle the Authority's last
// write recorded (WrittenBundleAnnotation) that its peers may sign or serve
// with although this process's state in force lacks them, when the other
// writer rewrote the Secret since: the CA that write signed with
// (WrittenCAAnnotation: a peer's adoption, the trim after an episode or an
// operator's request, that this process never read, its reads failing or
// slow meanwhile), and every recorded CA a peer's Lease announces a leaf
// of (every one when this process cannot see the Leases), as a replica
// starting on the rewrite trusts them (machine.trustRecorded). The hold
// serves its state in force and the other writer's current CA only, so a
// rewrite after a peer's adoption took the CA the peer adopted, the other
// writer's previous one, out of this replica's bundle, its caBundle target
// and its ClusterTrustBundle, while its Lease still announced it until its
// next write: the peer's leaves of it failed their clients (the simulator,
// S2 and S1: seeds 1397, 1801, 1893). Left out: a CA no longer valid,
// marked compromised or dropped, or that a trim of this process left out
// (a rollback, never trusted again). Bounded by the record
// (maxRecordedTrust), never one per rewrite.
func (w *foreignWriter) peersRecordedLocked(in stepInput) []*x509.Certificate {
	st := in.read
	if in.written == "" || in.last == nil {
		return nil
	}
	seen := in.peerServes != nil && (in.obs.blind == nil || in.obs.blind() == "")
	var out []*x509.Certificate
	for _, c := range st.recorded {
		fp := Fingerprint(c)
		if !c.IsCA || !in.now.Before(c.NotAfter) || st.ops.marks(fp) || in.last.knows(c) || w.wasTrimmedLocked(c, in.now) {
			continue
		}
		if fp == in.written || !seen || in.peerServes(c) {
			out = append(out, c)
		}
	}
	return out
}

// settled records a check that decided without holding: an episode is
// over once its adoption (or a peer's) is in force.
func (w *foreignWriter) settled(now time.Time) {
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.active {
		w.adopted = now
		klog.Background().Info("The CA secret is left alone again; adopted once", "provider", w.name, "secret", w.key)
	}
	w.active, w.why, w.seen = false, "", ""
	w.mu.Unlock()
}

// anchored reports whether c is an anchor (anchoredLocked); false
// without Config.Adopt.
func (w *foreignWriter) anchored(c *x509.Certificate) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.anchoredLocked(c)
}

// anchoredLocked reports whether c is an anchor (anchor, origin): kept by
// every trim, never retired, never named as the other writer's.
func (w *foreignWriter) anchoredLocked(c *x509.Certificate) bool {
	return w.anchor != nil && w.anchor.Equal(c) || w.origin != nil && w.origin.Equal(c)
}

// rememberLocked adds c to the other writer's CAs (episode), keeping the
// last maxForeignCAs.
func (w *foreignWriter) rememberLocked(c *x509.Certificate) {
	if containsCert(w.episode, c) {
		return
	}
	if len(w.episode) == maxForeignCAs {
		w.episode = slices.Delete(w.episode, 0, 1)
	}
	w.episode = append(w.episode, c)
}

// kept is what an adoption that ends an episode brings back from last
// into the Secret as read (machine.restore's keep): see foreignWriter for
// the rule. peerServes reports whether a live peer's Lease announces a
// leaf c signed; nil without announcements, when every CA of last stays.
func (w *foreignWriter) kept(last *caSet, serving *x509.Certificate, peerServes func(*x509.Certificate) bool) []*x509.Certificate {
	w.mu.Lock()
	defer w.mu.Unlock()
	keep := []*x509.Certificate{}
	add := func(c *x509.Certificate) {
		if c != nil && !containsCert(keep, c) {
			keep = append(keep, c)
		}
	}
	add(serving)
	add(w.anchor)
	if w.origin != nil && last.knows(w.origin) {
		add(w.origin)
	}
	if last.signing != nil {
		add(last.signing.Cert)
	}
	// A successor of ours that the other writer's rewrite replaced signed
	// nothing here (it would be the serving CA), and a live peer's leaf of
	// it would be announced: without one it is dead weight, and a fresh
	// successor is published on schedule (a run on the real kube-apiserver
	// saw ca.crt keep it next to the new one).
	superseded := peerServes != nil && last.next != nil && !peerServes(last.next.Cert)
	if last.next != nil && !superseded {
		add(last.next.Cert)
	}
	for _, c := range last.bundle {
		if superseded && last.next.Cert.Equal(c) {
			continue
		}
		if peerServes == nil || !containsCert(w.episode, c) || peerServes(c) {
			add(c)
		}
	}
	if peerServes != nil {
		for _, c := range w.episode {
			if peerServes(c) {
				add(c)
			}
		}
	}
	return keep
}

// retireKept records, for each of the other writer's CAs the trim kept in
// st's bundle that neither signs nor is the successor (kept because a leaf
// served then chains to it), that it leaves the bundle once every leaf
// signed with it can have expired: retireIn from now (retire.go). Called
// with announcements only: without them a peer's leaf is unknown, and the
// CA stays until it expires. It reports whether it recorded one: written
// at once, so that every replica drops the CA at the same time.
func (w *foreignWriter) retireKept(st *caSet, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, recorded := now.Add(w.retireIn), false
	for _, c := range st.bundle {
		if !containsCert(w.episode, c) || st.knowsSigning(c) || w.anchoredLocked(c) {
			continue
		}
		if t, ok := st.retire[Fingerprint(c)]; ok && !t.After(at) {
			continue // a peer's trim recorded it already
		}
		st.retireAt(c, at)
		recorded = true
	}
	return recorded
}

// retireReplaced records, for each CA of prev that the other writer wrote
// and that signed here (the adoption that ended an overlap's episode, or
// a pod's first read of a rewrite) but no longer signs in st, that it
// leaves st's bundle retireIn from now, as retireKept does for the CAs a
// trim kept for a served leaf: nothing signs with it after the rotation
// that replaced it, and it is valid for years (ten at cert-controller's
// defaults). Before, it stayed until it expired, one more after each
// overlap (the simulator's A3). Never the anchor (see there), nor a CA
// the Secret records a retirement for already. It reports whether it
// recorded one: written at once, so that every replica drops the CA at the
// same time. Only after an overlap this process knows of: without one,
// the adopted CA stays until it expires, as after any adoption.
func (w *foreignWriter) retireReplaced(st *caSet, prev []*x509.Certificate, now time.Time) bool {
	if w == nil || st.signing == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.anchor == nil && !w.overlapSeen {
		// No overlap this process saw itself (overlapSeen): the adopted
		// CA stays until it expires, as after any adoption
		// (docs/migrating.md).
		return false
	}
	recorded := false
	for _, c := range prev {
		if st.knowsSigning(c) || !containsCert(st.bundle, c) || !containsCert(w.episode, c) || w.anchoredLocked(c) {
			continue
		}
		if _, ok := st.retire[Fingerprint(c)]; ok {
			continue
		}
		st.retireAt(c, now.Add(w.retireIn))
		recorded = true
	}
	return recorded
}

// trim records, after an adoption that ended an episode left st in force
// (or is about to write it), every CA that last had or that the other
// writer wrote during the episode and st leaves out: none of them signs
// again (wasTrimmed). Idempotent: a step retried after a conflict records
// the same CAs.
func (w *foreignWriter) trim(last, st *caSet, now time.Time) {
	if w == nil || last == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	cands := slices.Clone(last.bundle)
	if last.signing != nil {
		cands = append(cands, last.signing.Cert)
	}
	if last.next != nil {
		cands = append(cands, last.next.Cert)
	}
	cands = append(cands, w.episode...)
	for _, c := range cands {
		if st.knows(c) || !now.Before(c.NotAfter) {
			continue
		}
		if w.trimmed == nil {
			w.trimmed = map[string]time.Time{}
		}
		w.trimmed[Fingerprint(c)] = c.NotAfter
	}
	for fp, end := range w.trimmed {
		if !now.Before(end) {
			delete(w.trimmed, fp)
		}
	}
	for len(w.trimmed) > maxTrimmedCAs {
		first := ""
		for fp, end := range w.trimmed {
			if first == "" || end.Before(w.trimmed[first]) || end.Equal(w.trimmed[first]) && fp < first {
				first = fp
			}
		}
		delete(w.trimmed, first)
	}
}

// wasTrimmed reports whether a trim of this process's left c out (trim),
// and c has not expired.
func (w *foreignWriter) wasTrimmed(c *x509.Certificate, now time.Time) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wasTrimmedLocked(c, now)
}

func (w *foreignWriter) wasTrimmedLocked(c *x509.Certificate, now time.Time) bool {
	end, ok := w.trimmed[Fingerprint(c)]
	return ok && now.Before(end)
}

// evercertMarks lists the evercert.io annotations of a Secret as read,
// sorted: any of them says that the Authority (or an operator of it) wrote
// there.
func evercertMarks(s *corev1.Secret) []string {
	var marks []string
	for k := range s.Annotations {
		if strings.HasPrefix(k, evercertAnnotationPrefix) {
			marks = append(marks, k)
		}
	}
	slices.Sort(marks)
	return marks
}

// evercertAnnotationPrefix starts every annotation the Authority or its
// operator writes on the Secret.
const evercertAnnotationPrefix = "evercert.io/"

// reason is the Stalled reason while another writer keeps rewriting the
// Secret, "" otherwise.
func (w *foreignWriter) reason() string {
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.why
}
