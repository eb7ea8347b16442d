package authority

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// LeaseAgesAnnotation records, one Lease per line as "<lease> <version>
// <seconds>", how long the replicas of this Authority watched a peer's
// Lease stay at that version without a renewal, so that a Lease left by a
// killed replica ages out even while every process lives shorter than a
// lease duration (a Deployment rolled out every few minutes). Written by
// the replicas; safe to delete (the watch time starts over).
const LeaseAgesAnnotation = "evercert.io/unrenewed-leases"

// maxLeaseAges bounds LeaseAgesAnnotation; the most aged are kept (they
// are the closest to being judged dead by every process that reads them).
const maxLeaseAges = 32

// leaseAge is one line of LeaseAgesAnnotation.
//
// Why it exists: a process keeps its watch time in memory only, and counts
// a Lease it sees for the first time as live for at least two renewal
// intervals and the skew tolerance from then (replicaSet.observeLocked). A
// Lease left behind by a killed replica would hold every rotation and
// emergency for as long as processes are replaced faster than that; the
// record carries the watch time over to the processes that follow.
//
// Each age is a lower bound of the real time the version has existed, so
// it stays true whatever happens after it is written (a rollback of the
// Secret included): the version is the Lease's resourceVersion and
// renewTime, which every renewal, delete or re-create changes, and only
// time a process spent watching counts (pauses and clock jumps do not; see
// replicaSet.unseenLocked). Nothing in it depends on how the writers'
// clocks compare. Writing it takes write access to the Secret, which
// already is the CA.
type leaseAge struct {
	name, version string
	age           time.Duration
}

func parseLeaseAges(s *corev1.Secret) []leaseAge {
	v := s.Annotations[LeaseAgesAnnotation]
	if v == "" {
		return nil
	}
	var ages []leaseAge
	for _, line := range strings.Split(v, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue // a garbled line says nothing; it is dropped at the next write
		}
		secs, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil || secs < 0 || secs > int64(365*24*time.Hour/time.Second) {
			continue
		}
		if !slices.ContainsFunc(ages, func(a leaseAge) bool { return a.name == f[0] }) {
			ages = append(ages, leaseAge{name: f[0], version: f[1], age: time.Duration(secs) * time.Second})
		}
	}
	return ages
}

func writeLeaseAges(ages []leaseAge, s *corev1.Secret) {
	if len(ages) == 0 {
		delete(s.Annotations, LeaseAgesAnnotation)
		return
	}
	lines := make([]string, len(ages))
	for n, a := range ages {
		lines[n] = fmt.Sprintf("%s %s %d", a.name, a.version, int64(a.age/time.Second))
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[LeaseAgesAnnotation] = strings.Join(lines, "\n")
}

// mergeLeaseAges takes the ages read from the Secret at now into the
// Leases this process watches, and returns the record to keep: what was
// read, without the Leases it knows to have changed or gone, and, when
// waiting (a successor waits for the live replicas), with the ages this
// process has watched since. changed says that the record grew enough to
// be worth a write: a Lease newly overdue, a further sixth of its
// duration watched, or judged dead. A record that only shrinks is not
// written on its own: its stale lines no longer match anything.
//
// Only while a successor waits does a Lease's liveness hold anything up,
// so only then is the record written: a renewal seen late (a slow write, a
// watch behind) makes a live Lease look overdue now and then, which would
// cost a Secret write at rest.
func (r *replicaSet) mergeLeaseAges(read []leaseAge, now time.Time, waiting bool) (out []leaseAge, changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	unseen := r.unseenLocked(now)
	noted := map[string]time.Duration{}
	for _, a := range read {
		l := r.seen[a.name]
		if l != nil && (l.deleted || l.rv != a.version) {
			continue // renewed, re-created or deleted since: the line is stale
		}
		if l == nil {
			if r.listed && !r.listForbidden {
				continue // gone
			}
			out = append(out, a) // not listed here (yet): keep it for others
			continue
		}
		if a.name != r.leaseName && l.holder != r.id {
			// The version existed for a.age before the record was read,
			// so at least that long before now.
			l.observedAt = earliest(l.observedAt, now.Add(-a.age))
		}
		noted[a.name] = a.age
		out = append(out, a)
	}
	if !waiting || unseen > r.skew {
		return out, false // nothing waits, or this process was not watching
	}
	for name, l := range r.seen {
		if name == r.leaseName || l.holder == r.id || l.deleted || l.stale {
			continue
		}
		age := now.Sub(l.observedAt) - unseen
		if age < l.duration/2 {
			// Not overdue: a live replica renews every third of its
			// duration. (Ages are watch time, so the skew tolerance has
			// no part in this.)
			continue
		}
		if prev, ok := noted[name]; ok && (prev >= l.duration || age < prev+l.duration/6 && age < l.duration) {
			continue // recorded as dead already, or not enough older than recorded
		}
		a := leaseAge{name: name, version: l.rv, age: age.Truncate(time.Second)}
		if i := slices.IndexFunc(out, func(o leaseAge) bool { return o.name == name }); i >= 0 {
			out[i] = a
		} else {
			out = append(out, a)
		}
		changed = true
	}
	if len(out) > maxLeaseAges {
		slices.SortStableFunc(out, func(a, b leaseAge) int { return cmp.Compare(b.age, a.age) })
		out = out[:maxLeaseAges]
	}
	slices.SortFunc(out, func(a, b leaseAge) int { return strings.Compare(a.name, b.name) })
	return out, changed
}
