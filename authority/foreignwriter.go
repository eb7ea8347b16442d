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
// added, never one per rewrite. It reports Stalled with the reason
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
// (rewritten): a Secret that carries an operator's mark (a compromised CA,
// a rotation request) or an emergency's record is always decided at once,
// so an emergency never waits for a hold (machine.step runs the emergency
// on it), and in the cert-manager layout, which is the Authority's own, a
// Secret with any evercert.io annotation is taken for a peer's write: a
// paused replica that missed a peer's emergency (one CA in tls.crt and
// ca.crt, as cert-manager writes) must follow it, not serve the
// compromised CA it had (a review found the first attempt doing that).
// Every replica writes ReplicaNamesAnnotation with its first write, so in
// practice cert-manager's webhook is not held once evercert wrote the
// Secret (docs/migrating.md says to stop it first); the other layouts are
// never written by an Authority, so their data alone name the writer.
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
// Then the replica adopts once (trim): ca.crt keeps the adopted CA (which
// signs, and which the old rotator's last leaf chains to: its pods may
// serve that leaf until they are gone), the CA of the leaf this replica
// serves (the leaves the Authority's replicas served during the overlap
// chain to it; each replica brings back its own), and a successor if the
// Secret publishes one; not every CA this replica ever knew, which restore
// writes back after a rollback. A replica that reads the adoption another
// replica wrote keeps the same rule. Every CA the trim leaves out (and
// every CA of the other writer's that this replica read during the
// episode) is remembered as trimmed until it expires: a backup restored
// from the overlap that brings one back as the signing CA is a rollback
// (machine.restore), so that CA never signs again; the clients were given
// the trimmed bundle and do not trust it (a review found leaves of such a
// CA failing with "x509: certificate signed by unknown authority").
type foreignWriter struct {
	name, key string
	layout    SecretLayout
	report    *reporter
	// quiet hands out the quiet period of each episode; see above.
	quiet *backoff.Backoff

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
	// episode holds the other writer's CAs read during the current
	// episode; trimmed maps the fingerprint of each CA a trim left out to
	// its NotAfter (forgotten after it).
	episode []*x509.Certificate
	trimmed map[string]time.Time
}

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
	if st.ops.any() {
		// An operator's mark or an emergency's record, in any layout: the
		// emergency is acted on at once, whatever the old rotator does.
		return false
	}
	if w.layout == LayoutCertManager {
		// cert-manager's layout is the Authority's: its DynamicAuthority's
		// rewrite is a new CA written to tls.crt and to ca.crt alone
		// (other keys stay), which an Authority never writes (its ca.crt
		// keeps every CA still trusted) but after an emergency or a
		// retirement that a paused replica missed. Those carry the
		// Authority's annotations; a Secret with any is a peer's.
		return len(in.marks) == 0 && len(st.bundle) == 1 && st.bundle[0].Equal(st.signing.Cert)
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
	if !w.rewritten(in) {
		return nil, w.active
	}
	now := in.now
	fp := Fingerprint(st.signing.Cert)
	if fp != w.seen {
		w.seen, w.since = fp, now
		w.episode = append(w.episode, st.signing.Cert)
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
		if !containsCert(serve.bundle, st.signing.Cert) {
			serve.bundle = append(serve.bundle, st.signing.Cert)
		}
		return &foreignWriterHold{reason: w.why, retryIn: left, serve: &serve}, false
	}
	w.why = ""
	return nil, true
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
	w.active, w.why, w.seen, w.episode = false, "", "", nil
	w.mu.Unlock()
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

// neededAfter is what a trimmed adoption keeps of last besides the Secret
// as read: the CA of the leaf this replica serves (the CA it signed with,
// before its first leaf). Each replica keeps its own, so the leaves of all
// of them keep verifying; a CA that no replica serves a leaf of any more
// is not brought back.
func neededAfter(last *caSet, serving *x509.Certificate) []*x509.Certificate {
	keep := make([]*x509.Certificate, 0, 1)
	switch {
	case serving != nil:
		keep = append(keep, serving)
	case last.signing != nil:
		keep = append(keep, last.signing.Cert)
	}
	return keep
}
