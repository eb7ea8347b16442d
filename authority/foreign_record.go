package authority

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// OtherWriterCAsAnnotation lists, on every write of an Authority that
// adopts another rotator's Secret (Config.Adopt), the Fingerprints
// (comma-separated, in ca.crt's order) of the CAs in ca.crt that the other
// rotator wrote: the one its first adoption took over and those of the
// rewrites of an overlap that the trim kept (foreignWriter). Every replica
// reads it, so the trim after another writer's rewrites treats those CAs
// as the other writer's (kept only while a leaf is served from them)
// whatever this process itself read: a replica that started during the
// overlap, or whose watch skipped a rewrite, learned such a CA from a
// peer's write only and kept it as evercert's own, until it expired (ten
// years at cert-controller's defaults). In a rolling update each new pod
// adopted the rewrite it read first and kept its predecessors' (the
// simulator's A2: one CA more in ca.crt per pod). The old rotator's
// rewrites keep the annotation, as they keep every annotation. Removing it
// only makes the replicas keep those CAs until they expire, as evercert's
// own CAs stay; listing one of evercert's own CAs in it drops that CA only
// once no live replica announces a leaf of it. Not written in the
// Authority's own layout (nothing is adopted there).
const OtherWriterCAsAnnotation = "evercert.io/other-writer-cas"

// AnchorCAAnnotation holds, on every write of an Authority that adopts
// another rotator's Secret (Config.Adopt), the Fingerprint of the anchor:
// the CA adopted when the migration began (the first adoption of a Secret
// no Authority had written), as long as it is in ca.crt. Every replica
// keeps the anchor until it expires (a replica cut off since the migration
// began renews from it, whatever the length of the cut) and never names it
// in OtherWriterCAsAnnotation; a replica that starts during an overlap
// takes it from here rather than its own first adoption, which is then the
// other writer's like any rewrite: else each pod of a rolling update kept
// the rewrite it adopted first as its anchor, one CA more in ca.crt per pod
// for ten years at cert-controller's defaults (the simulator's A2). The
// old rotator's rewrites keep the annotation, as they keep every
// annotation; every write names the anchor the writing process knows, else
// keeps the value as read while it names a CA of ca.crt. Editing it only
// keeps the CA it names longer (for the replicas that read it before a
// replica that knows the anchor writes it back); a process never retires
// an anchor it knows, whatever a peer recorded (machine.retire). Removing
// it makes a replica that starts during an overlap, before any write
// names it again, keep its first adoption as before, until it expires.
// Not written in the Authority's own layout.
const AnchorCAAnnotation = "evercert.io/anchor-ca"

// learnRecorded adds to the other writer's CAs (episode) those of st (its
// signing CA, successor, bundle and recorded bundle) that
// OtherWriterCAsAnnotation of s lists: another replica adopted or read
// them as the other writer's. The first of them that AnchorCAAnnotation
// names is the fleet's anchor (origin), unless this process knows it
// already.
func (w *foreignWriter) learnRecorded(s *corev1.Secret, st *caSet) {
	if w == nil {
		return
	}
	v, anchor := s.Annotations[OtherWriterCAsAnnotation], s.Annotations[AnchorCAAnnotation]
	if v == "" && anchor == "" {
		return
	}
	fps := strings.Split(v, ",")
	if len(fps) > maxForeignCAs {
		fps = fps[:maxForeignCAs] // not the Authority's: it writes at most as many
	}
	cands := slices.Concat(st.bundle, st.recorded)
	if st.signing != nil {
		cands = append(cands, st.signing.Cert)
	}
	if st.next != nil {
		cands = append(cands, st.next.Cert)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range cands {
		fp := Fingerprint(c)
		if w.origin == nil && fp == anchor {
			w.origin = c
		}
		if v != "" && slices.Contains(fps, fp) {
			w.rememberLocked(c)
		}
	}
}

// writeRecord stores in s, written with st in force, the CAs of st's
// bundle that this process knows as the other writer's
// (OtherWriterCAsAnnotation) and the anchor (AnchorCAAnnotation: as read,
// else the one this process knows, while it is in st's bundle); none in
// the Authority's own layout.
func (w *foreignWriter) writeRecord(s *corev1.Secret, st *caSet) {
	var fps []string
	anchor := ""
	if w != nil && w.layout != LayoutEvercert {
		w.mu.Lock()
		inBundle := map[string]bool{}
		for _, c := range st.bundle {
			inBundle[Fingerprint(c)] = true
			// Never an anchor: every replica keeps it until it expires
			// (a replica cut off since the overlap began renews from it),
			// and a replica that learned it here as the other writer's
			// would trim it (review43b).
			if containsCert(w.episode, c) && !w.anchoredLocked(c) {
				fps = append(fps, Fingerprint(c))
			}
		}
		// The anchor this process knows first: a hand edit of the
		// annotation is written over by every replica that knows the
		// fleet's anchor, so the pods started since learn it (review 45).
		switch {
		case w.origin != nil && inBundle[Fingerprint(w.origin)]:
			anchor = Fingerprint(w.origin)
		case inBundle[s.Annotations[AnchorCAAnnotation]]:
			anchor = s.Annotations[AnchorCAAnnotation]
		}
		w.mu.Unlock()
	}
	setAnnotation(s, OtherWriterCAsAnnotation, strings.Join(fps, ","))
	setAnnotation(s, AnchorCAAnnotation, anchor)
}

// setAnnotation sets s's annotation k to v, or removes it when v is "".
func setAnnotation(s *corev1.Secret, k, v string) {
	if v == "" {
		delete(s.Annotations, k)
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[k] = v
}
