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

// learnRecorded adds to the other writer's CAs (episode) those of st (its
// signing CA, successor, bundle and recorded bundle) that
// OtherWriterCAsAnnotation of s lists: another replica adopted or read
// them as the other writer's.
func (w *foreignWriter) learnRecorded(s *corev1.Secret, st *caSet) {
	if w == nil {
		return
	}
	v := s.Annotations[OtherWriterCAsAnnotation]
	if v == "" {
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
		if slices.Contains(fps, Fingerprint(c)) {
			w.rememberLocked(c)
		}
	}
}

// writeRecord stores in s, written with st in force, the CAs of st's
// bundle that this process knows as the other writer's
// (OtherWriterCAsAnnotation); none in the Authority's own layout.
func (w *foreignWriter) writeRecord(s *corev1.Secret, st *caSet) {
	var fps []string
	if w != nil && w.layout != LayoutEvercert {
		w.mu.Lock()
		for _, c := range st.bundle {
			// Never the anchor: every replica keeps it until it expires
			// (a replica cut off since the overlap began renews from it),
			// and a replica that learned it here as the other writer's
			// would trim it (review43b).
			if containsCert(w.episode, c) && (w.anchor == nil || !w.anchor.Equal(c)) {
				fps = append(fps, Fingerprint(c))
			}
		}
		w.mu.Unlock()
	}
	if len(fps) == 0 {
		delete(s.Annotations, OtherWriterCAsAnnotation)
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[OtherWriterCAsAnnotation] = strings.Join(fps, ",")
}
