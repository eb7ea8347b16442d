package sni

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"iter"
	"net/netip"
	"strings"
)

// errNothingLoaded is returned when no provider has ever had a valid
// certificate, so there is nothing to serve.
var errNothingLoaded = errors.New("no valid serving or SNI certificate has been loaded")

// snapshot is everything a handshake needs, built off the hot path and never
// modified after it is published, so handshakes read it without locks.
type snapshot struct {
	// config is handed to crypto/tls for every handshake. Its GetCertificate
	// is this snapshot's getCertificate.
	config *tls.Config

	// exact maps lower-case names to what they select.
	exact map[string]*choice
	// wildcard maps the suffix of "*.suffix" names to what they select, so
	// a lookup is a map access with a substring of the SNI name: no
	// allocation. The name "*" is stored under "" and matches single-label
	// names, as it does in crypto/tls and upstream.
	wildcard map[string]*choice
	// ips maps explicit IP names to what they select, for clients that send
	// no SNI. Keys are unmapped and zone-less.
	ips map[netip.Addr]*choice
	// def is served when nothing else matches; never nil.
	def *choice

	// served describes the certificates in Served order. It is kept compact
	// (pointers to descriptions the parse cache made once) because a
	// rebuild with thousands of providers should not re-describe every
	// certificate; Served expands it.
	served servedList
	// defaults are the indexes in served of the default's certificates.
	defaults []int
	// clientCAs describe the client CA bundle; shared with the parse cache,
	// never modified.
	clientCAs []ServedCertificate
}

// servedEntry is one certificate in a snapshot.
type servedEntry struct {
	desc  *ServedCertificate // immutable; Names and IsDefault unset
	names []string           // the names it is selected for in this snapshot
}

// snapshotInput is what buildSnapshot reads; the slots belong to the
// controller's parse cache.
type snapshotInput struct {
	base       *tls.Config
	clientAuth tls.ClientAuthType
	// serving is the serving provider's slot followed by the slots of its
	// alternatives (AlternativesProvider); empty without one.
	serving  []*certSlot
	sni      []*certSlot
	clientCA *caSlot // may be nil
}

// nameKind says which index a name goes to.
type nameKind int

const (
	exactName nameKind = iota
	wildcardName
	ipName
)

// classify returns the index and key for a name. Only explicit names can be
// IPs: an IP taken from a certificate is never indexed (see extractNames).
func classify(name string, explicit bool) (nameKind, string, netip.Addr) {
	if explicit {
		if addr, err := netip.ParseAddr(name); err == nil {
			return ipName, name, addr.Unmap().WithZone("")
		}
	}
	if name == "*" {
		return wildcardName, "", netip.Addr{}
	}
	if suffix, ok := strings.CutPrefix(name, "*."); ok {
		return wildcardName, suffix, netip.Addr{}
	}
	return exactName, name, netip.Addr{}
}

// buildSnapshot builds the name index and the prepared config from the
// slots' last good content, and records each slot's entry in served
// (certSlot.servedIndex). It fails only if there is no certificate at all.
func buildSnapshot(in snapshotInput) (*snapshot, error) {
	s := &snapshot{served: newServedList(len(in.serving) + len(in.sni))}

	var def *certSlot
	for _, slot := range in.serving {
		if slot.pair == nil {
			continue
		}
		if def == nil {
			def = slot
		}
		slot.servedIndex = s.served.append(servedEntry{desc: slot.desc})
	}
	nNames := 0
	for _, slot := range in.sni {
		if slot.pair == nil {
			continue // never had valid content: left out
		}
		if def == nil && !slot.nameOnly {
			// No serving certificate: the first valid SNI certificate in the
			// given order is the default, so the choice never varies. A
			// name-only certificate is an internal identity, never a default.
			def = slot
		}
		slot.servedIndex = s.served.append(servedEntry{desc: slot.desc})
		names, _ := slot.names()
		nNames += len(names)
	}
	if def == nil {
		return nil, errNothingLoaded
	}
	// The default's alternatives: certificates of other key algorithms for
	// exactly the same subject alternative names, the serving provider's
	// alternatives first, then SNI certificates in order.
	s.def = def.single
	if def.sans != "" {
		for slot := range chainSlots(in.serving, in.sni) {
			if slot.pair != nil && slot != def && !slot.nameOnly && slot.sans == def.sans {
				s.def = s.def.join(&slot.pair.TLS, nil)
			}
		}
	}

	s.exact = make(map[string]*choice, nNames)
	// Name-only providers first, so that an internal identity keeps its
	// names whatever the order; then explicit names, so that they win over
	// names taken from any certificate; within each pass the earlier
	// provider wins against a certificate of the same key algorithm, and a
	// later one of another algorithm joins it as an alternative. The last
	// two passes are upstream's precedence.
	for pass := range 3 {
		for _, slot := range in.sni {
			if slot.pair == nil {
				continue
			}
			names, explicit := slot.names()
			if (pass == 0) != slot.nameOnly || (pass == 1 && !explicit) || (pass == 2 && explicit) {
				continue
			}
			for _, name := range names {
				s.claim(name, explicit, slot, false)
			}
		}
	}
	// The serving certificates claim no names (they are the default), but
	// join the names an SNI certificate claimed that they are valid for,
	// so a client gets the serving certificate of its algorithm there too.
	for _, slot := range in.serving {
		if slot.pair == nil {
			continue
		}
		for _, name := range slot.extracted {
			s.claim(name, false, slot, true)
		}
		for _, ip := range slot.ipSANs {
			s.claim(ip, true, slot, true)
		}
	}

	// Record which names each certificate is selected for, in its own
	// order, in one buffer for all of them.
	buf := make([]string, 0, nNames)
	i := 0 // index in served: slots with content, in the same order
	for slot := range chainSlots(in.serving, in.sni) {
		if slot.pair == nil {
			continue
		}
		start := len(buf)
		cert := &slot.pair.TLS
		if slot.sni != nil {
			names, explicit := slot.names()
			for _, name := range names {
				if s.lookup(name, explicit).has(cert) {
					buf = append(buf, name)
				}
			}
		} else {
			for _, name := range slot.extracted {
				if s.lookup(name, false).has(cert) {
					buf = append(buf, name)
				}
			}
			for _, ip := range slot.ipSANs {
				if s.lookup(ip, true).has(cert) {
					buf = append(buf, ip)
				}
			}
		}
		s.served.at(i).names = buf[start:len(buf):len(buf)]
		if s.def.has(cert) {
			s.defaults = append(s.defaults, i)
		}
		i++
	}

	s.prepareConfig(in)
	return s, nil
}

// prepareConfig sets the config handed to crypto/tls, and the client CA
// descriptions, from in's base config and client CA.
func (s *snapshot) prepareConfig(in snapshotInput) {
	cfg := in.base.Clone()
	cfg.Certificates = nil
	//lint:ignore SA1019 cleared so crypto/tls never consults a map a caller left in the base config
	cfg.NameToCertificate = nil
	cfg.GetCertificate = s.getCertificate
	cfg.GetConfigForClient = nil
	cfg.ClientAuth = in.clientAuth
	if in.clientCA != nil {
		if in.clientCA.loaded {
			cfg.ClientCAs = in.clientCA.pool
			s.clientCAs = in.clientCA.descs
		} else {
			// A client CA is configured but never loaded: fail closed with an
			// empty pool. A nil pool would make crypto/tls verify client
			// certificates against the system roots.
			cfg.ClientCAs = x509.NewCertPool()
		}
	}
	s.config = cfg
}

// chainSlots iterates over the serving slots, then the SNI slots, in
// Served order, without copying them into one slice.
func chainSlots(serving, sni []*certSlot) iter.Seq[*certSlot] {
	return func(yield func(*certSlot) bool) {
		for _, slots := range [2][]*certSlot{serving, sni} {
			for _, slot := range slots {
				if !yield(slot) {
					return
				}
			}
		}
	}
}

// claim gives name to slot's certificate unless a certificate of the same
// key algorithm holds it; with joinOnly, only a name someone holds is
// joined.
func (s *snapshot) claim(name string, explicit bool, slot *certSlot, joinOnly bool) {
	kind, key, addr := classify(name, explicit)
	switch kind {
	case ipName:
		s.ips = claimIn(s.ips, addr, slot, joinOnly)
		// Also by its text, as upstream does, for clients that put an IP
		// literal in SNI despite RFC 6066.
		s.exact = claimIn(s.exact, key, slot, joinOnly)
	case wildcardName:
		s.wildcard = claimIn(s.wildcard, key, slot, joinOnly)
	default:
		s.exact = claimIn(s.exact, key, slot, joinOnly)
	}
}

// claimIn claims key in m for slot (see claim), making m if it is nil.
func claimIn[K comparable](m map[K]*choice, key K, slot *certSlot, joinOnly bool) map[K]*choice {
	held, taken := m[key]
	switch {
	case taken:
		m[key] = held.join(&slot.pair.TLS, slot.owner)
	case !joinOnly:
		if m == nil {
			m = make(map[K]*choice)
		}
		m[key] = slot.single
	}
	return m
}

// lookup returns what name selects in the index, or nil.
func (s *snapshot) lookup(name string, explicit bool) *choice {
	kind, key, addr := classify(name, explicit)
	switch kind {
	case ipName:
		return s.ips[addr]
	case wildcardName:
		return s.wildcard[key]
	default:
		return s.exact[key]
	}
}
