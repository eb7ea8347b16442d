package sni

import (
	"crypto/tls"
	"maps"
	"slices"
)

// deriveSnapshot returns the snapshot that buildSnapshot would build from
// in, given prev, the current snapshot, when no slot needs a reindex
// (certSlot.reindex): every slot has the same names, SANs, key algorithm
// and presence as when prev's index was built, so every name selects the
// same slots in the same order, and only the certificates of the changed
// slots (pair != inSnapshot) differ. Each changed certificate replaces its
// predecessor inside the choices that hold it (the default's, and those of
// the names the slot claims or joins), in the same place, since the key
// algorithm is the same: a choice of the slot alone becomes the slot's new
// single choice, a choice of several candidates is copied with that one
// candidate replaced, and the others stay. The index maps touched are
// copied; the other maps, and everything else, are shared with prev, which
// is never modified. The cost is a copy of the affected maps and of the
// affected chunks of served, instead of classifying and claiming every
// name of every provider again: a rebuild after one of 100,000 providers
// rotated is a few milliseconds.
func deriveSnapshot(prev *snapshot, in snapshotInput, changed []*certSlot) *snapshot {
	s := &snapshot{
		exact:    prev.exact,
		wildcard: prev.wildcard,
		ips:      prev.ips,
		def:      prev.def,
		served:   prev.served,
		defaults: prev.defaults,
	}
	if len(changed) > 0 {
		var w indexWriter
		for _, slot := range changed {
			r := replacement{old: &slot.inSnapshot.TLS, cur: &slot.pair.TLS, single: slot.single}
			if s.def.has(r.old) {
				s.def = r.in(s.def)
			}
			w.setDesc(s, slot.servedIndex, slot.desc)
			if slot.sni != nil {
				names, explicit := slot.names()
				for _, name := range names {
					w.replace(s, name, explicit, &r)
				}
				continue
			}
			// A serving certificate claims no names but joins those of
			// its SANs an SNI certificate claimed (see buildSnapshot).
			for _, name := range slot.extracted {
				w.replace(s, name, false, &r)
			}
			for _, ip := range slot.ipSANs {
				w.replace(s, ip, true, &r)
			}
		}
	}
	s.prepareConfig(in)
	return s
}

// replacement replaces one slot's old certificate by its current one in
// choices. The choices it makes are remembered, so a choice shared by
// several names stays shared.
type replacement struct {
	old, cur *tls.Certificate
	// single is the slot's choice of cur alone (certSlot.single).
	single *choice
	made   map[*choice]*choice
}

// in returns c with old replaced by cur, in old's place; c must hold old.
func (r *replacement) in(c *choice) *choice {
	if len(c.certs) == 1 && c.owner == r.single.owner {
		return r.single // the slot's old single choice
	}
	if made, ok := r.made[c]; ok {
		return made
	}
	certs := slices.Clone(c.certs)
	certs[slices.Index(certs, r.old)] = r.cur
	made := &choice{certs: certs, owner: c.owner}
	if r.made == nil {
		r.made = map[*choice]*choice{}
	}
	r.made[c] = made
	return made
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

// replace replaces r.old by r.cur in the index entries for name that hold
// it; entries that do not (another certificate of the same key algorithm
// claimed the name earlier) are left alone. The lookups are classify's, as
// in claim and lookup.
func (w *indexWriter) replace(s *snapshot, name string, explicit bool, r *replacement) {
	kind, key, addr := classify(name, explicit)
	switch kind {
	case ipName:
		if c := s.ips[addr]; c.has(r.old) {
			if !w.ips {
				s.ips, w.ips = maps.Clone(s.ips), true
			}
			s.ips[addr] = r.in(c)
		}
		w.replaceExact(s, key, r) // an IP is indexed by its text too
	case wildcardName:
		if c := s.wildcard[key]; c.has(r.old) {
			if !w.wildcard {
				s.wildcard, w.wildcard = maps.Clone(s.wildcard), true
			}
			s.wildcard[key] = r.in(c)
		}
	default:
		w.replaceExact(s, key, r)
	}
}

func (w *indexWriter) replaceExact(s *snapshot, key string, r *replacement) {
	if c := s.exact[key]; c.has(r.old) {
		if !w.exact {
			s.exact, w.exact = maps.Clone(s.exact), true
		}
		s.exact[key] = r.in(c)
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
