package authority

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ReplicaNamesAnnotation lists, one per line, the names (Config.Hosts, in
// the canonical form "[dns names] [ip addresses]") that the replicas
// sharing this CA Secret issue their serving leaves for. A replica believes
// an announced leaf only for its own names or for names listed here: the
// CA also signs leaves for others (podcert, SignLeaf) whose holders must not
// confirm anything for the replicas, and writing this list takes write
// access to the Secret, which already is the CA. Each replica adds its own
// names when they are missing, so two Authorities on one Secret with
// different Hosts, or a rollout that changes them, wait for each other
// instead of rejecting each other's announcements as forged (and promoting
// a CA the other's clients may lack). The list keeps the newest
// maxReplicaNameSets.
const ReplicaNamesAnnotation = "evercert.io/replica-leaf-names"

// maxReplicaNameSets bounds ReplicaNamesAnnotation: a rollout that changes
// Hosts needs two sets; beyond the bound, the oldest sets that no live
// replica announces are dropped (one that still runs with them adds them
// back at its next check). Sets in use are never dropped: with more of them
// than the bound, each replica would drop another's to add its own, and
// the replicas would rewrite the Secret in turn for ever.
const maxReplicaNameSets = 8

// namesInUse reports whether a live replica announces a leaf for the leaf
// names set (see leafNames): a believed announcement, or one held only
// because the Secret does not list its names (a leaf of the Secret's CAs,
// signed by its key), renewed within its duration.
func (r *replicaSet) namesInUse(set string) bool {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	unseen := r.unseenLocked(now)
	if !r.rootsKnown && len(r.held) > 0 {
		// Leases held unjudged: before this process read the CAs it checks
		// announcements against, it cannot tell which sets they announce,
		// and dropping theirs would make each owner add its own back, a
		// write per replica after every restart (a review found 8 with 10
		// sets). Every set counts as in use until they are judged.
		return true
	}
	for _, l := range r.seen {
		if l.leaf != nil && r.waitedForLocked(l, now, unseen) && leafNames(l.leaf.DNSNames, l.leaf.IPAddresses) == set {
			return true
		}
	}
	for _, h := range r.held {
		if h.unlisted == set && now.Before(h.seenAt.Add(r.duration+unseen)) {
			return true
		}
	}
	return false
}

// ReplicaNames returns the leaf names s lists for its replicas
// (ReplicaNamesAnnotation), for VerifyAnnouncement.
func ReplicaNames(s *corev1.Secret) []string { return parseReplicaNames(s) }

func parseReplicaNames(s *corev1.Secret) []string {
	v := s.Annotations[ReplicaNamesAnnotation]
	if v == "" {
		return nil
	}
	var sets []string
	for _, line := range strings.Split(v, "\n") {
		if line = strings.TrimSpace(line); line != "" && !slices.Contains(sets, line) {
			sets = append(sets, line)
		}
	}
	return sets
}

// addReplicaNames adds own to sets, newest last, and reports whether sets
// changed. inUse reports whether a live replica announces a set (nil: none
// known).
func addReplicaNames(sets *[]string, own string, inUse func(string) bool) bool {
	if own == "" || slices.Contains(*sets, own) {
		return false
	}
	*sets = append(*sets, own)
	for n := 0; len(*sets) > maxReplicaNameSets && n < len(*sets)-1; {
		if set := (*sets)[n]; inUse == nil || !inUse(set) {
			*sets = slices.Delete(*sets, n, n+1)
			continue
		}
		n++
	}
	if over := len(*sets) - 2*maxReplicaNameSets; over > 0 {
		// A hard bound for sets all counted in use (see namesInUse: every
		// set counts while Leases wait to be judged): the oldest go.
		*sets = slices.Delete(*sets, 0, over)
	}
	return true
}

func writeReplicaNames(sets []string, s *corev1.Secret) {
	if len(sets) == 0 {
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[ReplicaNamesAnnotation] = strings.Join(sets, "\n")
}
