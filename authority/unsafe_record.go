package authority

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Annotations recording, in the CA Secret, the unsafe rotations (a CA that
// signed before every observer confirmed it: Status.UnsafeRotations). The
// record is written in the same write that makes the CA sign, so it survives
// the writer: a replica that crashes right after promoting would otherwise
// take the only count with it, and every other replica, which only saw the
// Secret change, would report none. Every replica reads the record into
// Status.RecordedUnsafeRotations and evercert_unsafe_rotations_recorded.
const (
	// UnsafeRotationsAnnotation counts the unsafe rotations of this
	// Secret's CAs (decimal). Each CA is counted once, whichever replica
	// writes it first.
	UnsafeRotationsAnnotation = "evercert.io/unsafe-rotations"
	// LastUnsafeRotationAnnotation describes the last one:
	// "<RFC 3339 time> <Fingerprint of the CA>: <why>".
	LastUnsafeRotationAnnotation = "evercert.io/last-unsafe-rotation"
)

// maxUnsafeWhy bounds the reason kept in LastUnsafeRotationAnnotation: a
// sentence, not a log.
const maxUnsafeWhy = 512

// unsafeRecord is the record as read from, and written to, the Secret.
type unsafeRecord struct {
	count int
	// last is LastUnsafeRotationAnnotation's value; fingerprint the CA it
	// names ("" when none or garbled).
	last, fingerprint string
}

func parseUnsafeRecord(s *corev1.Secret) unsafeRecord {
	a := s.Annotations
	n, err := strconv.Atoi(a[UnsafeRotationsAnnotation])
	if err != nil || n < 0 {
		n = 0 // absent or garbled: counting starts over, never fails a check
	}
	r := unsafeRecord{count: n, last: a[LastUnsafeRotationAnnotation]}
	if fields := strings.Fields(r.last); len(fields) >= 2 {
		r.fingerprint = strings.TrimSuffix(fields[1], ":")
	}
	return r
}

// add records an unsafe rotation to CA fingerprint at now, unless it is the
// rotation recorded last (another replica, or this one before a conflict,
// recorded it already). It reports whether the record changed.
func (r *unsafeRecord) add(now time.Time, fingerprint, why string) bool {
	if fingerprint == "" || fingerprint == r.fingerprint {
		return false
	}
	if len(why) > maxUnsafeWhy {
		why = why[:maxUnsafeWhy] + "..."
	}
	r.count++
	r.fingerprint = fingerprint
	r.last = fmt.Sprintf("%s %s: %s", now.UTC().Format(time.RFC3339), fingerprint, why)
	return true
}

// write stores the record in s; a Secret without one keeps none.
func (r unsafeRecord) write(s *corev1.Secret) {
	if r.count == 0 && r.last == "" {
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[UnsafeRotationsAnnotation] = strconv.Itoa(r.count)
	if r.last != "" {
		s.Annotations[LastUnsafeRotationAnnotation] = r.last
	}
}
