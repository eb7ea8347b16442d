package sni

import (
	"crypto/tls"
	"maps"
	"slices"
)

// deriveSnapshot returns the snapshot that buildSnapshot would build from
// in, given prev, the current snapshot, when no slot needs a reindex
// (certSlot.reindex): every slot has the same names and the same presence
// as when prev's index was built, so every name has the same owner and only
// the certificates of the changed slots (pair != inSnapshot) differ. Those
// replace their predecessors in copies of the index maps they appear in;
// the other maps, and everything else, are shared with prev, which is never
// modified. The cost is a copy of the affected maps and of the affected
// chunks of served, instead of classifying and claiming every name of every
// provider again: a rebuild after one of 100,000 providers rotated is a few
// milliseconds.
func deriveSnapshot(prev *snapshot, in snapshotInput, changed []*certSlot) *snapshot {
	s := &snapshot{
		exact:        prev.exact,
		wildcard:     prev.wildcard,
		ips:          prev.ips,
		def:          prev.def,
		served:       prev.served,
		defaultIndex: prev.defaultIndex,
	}
	if len(changed) > 0 {
		var w indexWriter
		for _, slot := range changed {
			old, cur := &slot.inSnapshot.TLS, &slot.pair.TLS
			if s.def == old {
				s.def = cur
			}
			w.setDesc(s, slot.servedIndex, slot.desc)
			if slot.sni == nil {
				continue // the serving slot claims no names
			}
			names, explicit := slot.names()
			for _, name := range names {
				w.replace(s, name, explicit, old, cur)
			}
		}
	}
	s.prepareConfig(in)
	return s
}

// indexWriter copies each of a snapshot's index maps, and served and each
// of its chunks, the first time it writes to it, so what the snapshot
// shares with its predecessor is never modified.
type indexWriter struct {
	exact, wildcard, ips bool // copied already
	served               bool
	chunks               map[int]bool
}

// setDesc sets the description of served entry i.
func (w *indexWriter) setDesc(s *snapshot, i int, desc *ServedCertificate) {
	if !w.served {
		s.served.chunks, w.served = slices.Clone(s.served.chunks), true
		w.chunks = map[int]bool{}
	}
	c := i / servedChunk
	if !w.chunks[c] {
		s.served.chunks[c], w.chunks[c] = slices.Clone(s.served.chunks[c]), true
	}
	s.served.chunks[c][i%servedChunk].desc = desc
}

// replace gives the index entries for name that old holds to cur; entries
// another certificate holds (the name was claimed earlier) are left alone.
// The lookups are classify's, as in claim and owner.
func (w *indexWriter) replace(s *snapshot, name string, explicit bool, old, cur *tls.Certificate) {
	kind, key, addr := classify(name, explicit)
	switch kind {
	case ipName:
		if s.ips[addr] == old {
			if !w.ips {
				s.ips, w.ips = maps.Clone(s.ips), true
			}
			s.ips[addr] = cur
		}
		w.replaceExact(s, key, old, cur) // an IP is indexed by its text too
	case wildcardName:
		if s.wildcard[key] == old {
			if !w.wildcard {
				s.wildcard, w.wildcard = maps.Clone(s.wildcard), true
			}
			s.wildcard[key] = cur
		}
	default:
		w.replaceExact(s, key, old, cur)
	}
}

func (w *indexWriter) replaceExact(s *snapshot, key string, old, cur *tls.Certificate) {
	if s.exact[key] == old {
		if !w.exact {
			s.exact, w.exact = maps.Clone(s.exact), true
		}
		s.exact[key] = cur
	}
}

// servedChunk is how many entries a chunk of a servedList holds.
const servedChunk = 512

// servedList is a snapshot's list of served entries, stored in chunks of
// servedChunk entries so that a derived snapshot copies only the chunks it
// changes (indexWriter.setDesc) and shares the others.
type servedList struct {
	chunks [][]servedEntry
	n      int
	// hint is how many entries are expected in all, to size the chunks of
	// small lists to fit.
	hint int
}

func newServedList(hint int) servedList { return servedList{hint: hint} }

func (l *servedList) len() int { return l.n }

// append adds e and returns its index.
func (l *servedList) append(e servedEntry) int {
	if l.n%servedChunk == 0 {
		l.chunks = append(l.chunks, make([]servedEntry, 0, max(1, min(servedChunk, l.hint-l.n))))
	}
	last := len(l.chunks) - 1
	l.chunks[last] = append(l.chunks[last], e)
	l.n++
	return l.n - 1
}

// at returns entry i, for reading, or for writing while the list is built.
func (l *servedList) at(i int) *servedEntry {
	return &l.chunks[i/servedChunk][i%servedChunk]
}
