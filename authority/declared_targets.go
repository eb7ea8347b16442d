package authority

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// Declared caBundle targets (issue 27 §4): a replica that publishes the
// caBundle confirms a successor for its targets through its Lease, and a
// promotion waits for every live replica. A publisher that runs on one
// replica only and is down is not live, so nobody would wait for its
// targets. Every replica that publishes therefore declares its targets in
// the CA Secret, which every replica reads, and every replica, publisher or
// not, promotes a successor only once each declared target is covered: a
// live replica's believed announcement (signed, its leaf chaining to the
// Secret's CAs) names the target among those its observers stand for
// (CoveredTargetsAnnotation) and trusts the successor. Announcements, not
// reads of the targets, are the evidence: every replica already verifies
// them, they need no RBAC on the targets' kinds (which only the publishers
// have), and a publisher trusts a CA only once it read it back from every
// target.
const (
	// CABundleTargetsAnnotation lists, one per line, the caBundle targets
	// the replicas sharing this CA Secret publish to, each as
	// "<RFC 3339 time> <target>": the target as its publisher names it
	// (TargetObserver.Targets, e.g. "ValidatingWebhookConfiguration/my-hook";
	// kinds and names only, never content) and when a publisher last
	// declared it, on that publisher's clock. A declaration that no
	// publisher renews lapses (targetLapse) and is dropped.
	CABundleTargetsAnnotation = "evercert.io/cabundle-targets"
	// CoveredTargetsAnnotation lists, one per line, the caBundle targets a
	// replica's observers stand for (TargetObserver.Targets), in its Lease,
	// under its signature: the CAs it trusts (TrustedCAsAnnotation) are
	// held by each of them.
	CoveredTargetsAnnotation = "evercert.io/covered-targets"
)

// TargetObserver is an Observer that stands for named caBundle targets, such
// as a cabundle.Publisher. An Authority declares the targets in its CA
// Secret (CABundleTargetsAnnotation) and announces them in its Lease, so
// that every replica, including the ones that do not publish, waits for
// them before a successor signs, also while every replica that publishes is
// down.
type TargetObserver interface {
	Observer
	// Targets names the targets Observed stands for, each on one line of
	// at most maxTargetLen bytes, e.g. "ValidatingWebhookConfiguration/name".
	// It must not change while the observer is in use.
	Targets() []string
}

const (
	// maxDeclaredTargets bounds CABundleTargetsAnnotation. A declaration
	// is never dropped for the bound, only when it lapses: a publisher that
	// dropped another's to make room would have it added back at the
	// other's next check, and the two would rewrite the Secret in turn (a
	// review found that with 33 targets). A target that finds the list full
	// is not declared (undeclared, logged) until one lapses; a hand edit
	// beyond the bound keeps its first lines.
	maxDeclaredTargets = 128
	// maxTargetLen bounds one target's name; a longer one is cut.
	maxTargetLen = 512
	// minTargetLapse is the least time a declaration lasts unrenewed.
	minTargetLapse = 24 * time.Hour
)

// targetLapse is how long a declaration lasts when no publisher renews it:
// the time from a successor's publication to a stalled rotation
// (CARenewBefore - RenewBefore) less the propagation delay, at least a
// day. An operator who removes the publisher from the configuration leaves
// a declaration that nobody renews; until it lapses, successors wait for
// it, named in RotationStatus.Successor.Pending as "cabundle/<target>". A
// removal before a successor's publication so never stalls its rotation
// (the declaration lapses at least a delay before the stall), unless the
// floor is longer than that window (CAs that live less than about two
// days). A publisher down for less than this holds the rotation; one down
// longer is taken for removed, and what is promoted then is not counted
// unsafe: nothing tells the two apart yet (docs/operating.md). Publishers
// renew their declarations every quarter of it (targetRenewal).
func (r rotation) targetLapse() time.Duration {
	return max(r.caRenewBefore-r.leafRenewBefore-r.propagation, minTargetLapse)
}

func (r rotation) targetRenewal() time.Duration { return r.targetLapse() / 4 }

// declaredTarget is one line of CABundleTargetsAnnotation.
type declaredTarget struct {
	target string
	// renewed is when a publisher last declared it, on its clock; zero
	// when the line had no time that parses (it is renewed or lapses as if
	// declared when first read; see lapsed).
	renewed time.Time
}

func cleanTarget(t string) string {
	t = strings.TrimSpace(strings.ReplaceAll(t, "\n", " "))
	if len(t) > maxTargetLen {
		t = t[:maxTargetLen]
	}
	return t
}

func parseDeclaredTargets(s *corev1.Secret) []declaredTarget {
	v := s.Annotations[CABundleTargetsAnnotation]
	var out []declaredTarget
	for _, line := range strings.Split(v, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		d := declaredTarget{target: cleanTarget(line)}
		if at, rest, ok := strings.Cut(line, " "); ok {
			if t, err := time.Parse(time.RFC3339, at); err == nil {
				d = declaredTarget{target: cleanTarget(rest), renewed: t}
			}
		}
		if d.target == "" {
			continue
		}
		if i := slices.IndexFunc(out, func(o declaredTarget) bool { return o.target == d.target }); i >= 0 {
			if d.renewed.After(out[i].renewed) {
				out[i] = d
			}
			continue
		}
		if len(out) == maxDeclaredTargets {
			continue
		}
		out = append(out, d)
	}
	return out
}

func writeDeclaredTargets(ds []declaredTarget, s *corev1.Secret) {
	if len(ds) == 0 {
		delete(s.Annotations, CABundleTargetsAnnotation)
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	lines := make([]string, len(ds))
	for n, d := range ds {
		lines[n] = d.renewed.UTC().Format(time.RFC3339) + " " + d.target
	}
	s.Annotations[CABundleTargetsAnnotation] = strings.Join(lines, "\n")
}

// mergeDeclaredTargets returns the declarations of read with those of
// known that read lacks or holds renewed earlier, within the bound; it
// changes neither.
func mergeDeclaredTargets(read, known []declaredTarget) []declaredTarget {
	out := slices.Clone(read)
	for _, k := range known {
		switch i := slices.IndexFunc(out, func(d declaredTarget) bool { return d.target == k.target }); {
		case i >= 0 && k.renewed.After(out[i].renewed):
			out[i] = k
		case i < 0 && len(out) < maxDeclaredTargets:
			out = append(out, k)
		}
	}
	return out
}

// declareTargets is the machine's part of the declarations at now: it adds
// or renews this process's own targets (own) when missing or renewed more
// than targetRenewal ago, and drops the ones that lapsed. It never changes
// st.targets in place (the state in force shares it) and reports whether
// it changed, and which of own it could not add (the list is full: see
// maxDeclaredTargets).
func (m *machine) declareTargets(st *caSet, own []string, now time.Time) (changed bool, undeclared []string) {
	lapse, every := m.sched.targetLapse(), m.sched.targetRenewal()
	ds := slices.Clone(st.targets)
	for n := range ds {
		if ds[n].renewed.IsZero() {
			// No time that parses (a hand edit): renewed now, so it lapses
			// on schedule rather than at once or never.
			ds[n].renewed, changed = now, true
		}
		if ds[n].renewed.After(now.Add(m.sched.skew)) {
			// Further in this clock's future than any clock within the
			// tolerance renews (a hand edit, or a publisher whose clock
			// was far ahead and that has been removed since): taken as
			// renewed now, so that it lapses on schedule, not never.
			ds[n].renewed, changed = now, true
		}
	}
	for _, t := range own {
		if t = cleanTarget(t); t == "" {
			continue
		}
		i := slices.IndexFunc(ds, func(d declaredTarget) bool { return d.target == t })
		switch {
		case i < 0 && len(ds) >= maxDeclaredTargets:
			undeclared = append(undeclared, t)
		case i < 0:
			ds, changed = append(ds, declaredTarget{target: t, renewed: now}), true
		case !now.Before(ds[i].renewed.Add(every)):
			// A renewal in this clock's future (a publisher whose clock is
			// ahead) is left alone: rewriting it back would flip it between
			// the two.
			ds[i].renewed, changed = now, true
		}
	}
	kept := ds[:0:0]
	for _, d := range ds {
		// The skew tolerance: a publisher whose clock is behind renewed it
		// later than it says.
		if now.Before(d.renewed.Add(lapse + m.sched.skew)) {
			kept = append(kept, d)
			continue
		}
		changed = true
		klog.Background().Info("caBundle target declaration lapsed: no replica that publishes to it renewed it; successors no longer wait for it", "provider", m.sched.name,
			"target", d.target, "lastDeclared", d.renewed.UTC(), "lapse", lapse)
	}
	if changed {
		st.targets = kept
	}
	return changed, undeclared
}

// uncoveredTargets names, as "cabundle/<target>", each target declared in
// st that no live replica covers for ca (covered: the targets live
// replicas' believed announcements name and that trust ca; nil covers
// none). A successor signs only once there are none, but in an
// emergency, which does not wait for them and counts the promotion unsafe.
func (m *machine) uncoveredTargets(st *caSet, ca *x509.Certificate, covered func(*x509.Certificate) []string) []string {
	if len(st.targets) == 0 {
		return nil
	}
	var have []string
	if covered != nil {
		have = covered(ca)
	}
	var out []string
	for _, d := range st.targets {
		if !slices.Contains(have, d.target) {
			out = append(out, "cabundle/"+d.target)
		}
	}
	return out
}

// uncoveredWhy says why a CA signs with declared targets uncovered.
func uncoveredWhy(ca *x509.Certificate, targets []string) string {
	return fmt.Sprintf("CA %q signs while no live replica confirms that the declared caBundle targets %s hold it", ca.Subject.CommonName, strings.Join(targets, ", "))
}
