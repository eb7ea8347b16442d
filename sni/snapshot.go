package sni

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
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

	// exact maps lower-case names to certificates.
	exact map[string]*tls.Certificate
	// wildcard maps the suffix of "*.suffix" names to certificates, so a
	// lookup is a map access with a substring of the SNI name: no
	// allocation. The name "*" is stored under "" and matches single-label
	// names, as it does in crypto/tls and upstream.
	wildcard map[string]*tls.Certificate
	// ips maps explicit IP names to certificates, for clients that send no
	// SNI. Keys are unmapped and zone-less.
	ips map[netip.Addr]*tls.Certificate
	// def is served when nothing else matches; never nil.
	def *tls.Certificate

	// served describes the certificates in Served order; the one at
	// defaultIndex is def. It is kept compact (pointers to descriptions the
	// parse cache made once) because a rebuild with thousands of providers
	// should not re-describe every certificate; Served expands it.
	served       servedList
	defaultIndex int
	// clientCAs describe the client CA bundle; shared with the parse cache,
	// never modified.
	clientCAs []ServedCertificate
}

// servedEntry is one certificate in a snapshot.
type servedEntry struct {
	desc  *ServedCertificate // immutable; Names and IsDefault unset
	names []string           // the names it won in this snapshot
}

// snapshotInput is what buildSnapshot reads; the slots belong to the
// controller's parse cache.
type snapshotInput struct {
	base       *tls.Config
	clientAuth tls.ClientAuthType
	serving    *certSlot // may be nil
	sni        []*certSlot
	clientCA   *caSlot // may be nil
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
	s := &snapshot{served: newServedList(1 + len(in.sni))}

	if in.serving != nil && in.serving.pair != nil {
		s.def = &in.serving.pair.TLS
		in.serving.servedIndex = s.served.append(servedEntry{desc: in.serving.desc})
	}
	nNames := 0
	for _, slot := range in.sni {
		if slot.pair == nil {
			continue // never had valid content: left out
		}
		if s.def == nil && !slot.nameOnly {
			// No serving certificate: the first valid SNI certificate in the
			// given order is the default, so the choice never varies. A
			// name-only certificate is an internal identity, never a default.
			s.def = &slot.pair.TLS
			s.defaultIndex = s.served.len()
		}
		slot.servedIndex = s.served.append(servedEntry{desc: slot.desc})
		names, _ := slot.names()
		nNames += len(names)
	}
	if s.def == nil {
		return nil, errNothingLoaded
	}

	s.exact = make(map[string]*tls.Certificate, nNames)
	// Name-only providers first, so that an internal identity keeps its
	// names whatever the order; then explicit names, so that they win over
	// names taken from any certificate; within each pass the earlier
	// provider wins. The last two passes are upstream's precedence.
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
				s.claim(name, explicit, &slot.pair.TLS)
			}
		}
	}

	// Record which names each certificate won, in its own order, in one
	// buffer for all of them.
	buf := make([]string, 0, nNames)
	i := s.served.len() - 1
	for j := len(in.sni) - 1; j >= 0; j-- { // backwards, to pair slots with entries
		slot := in.sni[j]
		if slot.pair == nil {
			continue
		}
		start := len(buf)
		names, explicit := slot.names()
		for _, name := range names {
			if s.owner(name, explicit) == &slot.pair.TLS {
				buf = append(buf, name)
			}
		}
		s.served.at(i).names = buf[start:len(buf):len(buf)]
		i--
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

// claim gives name to cert unless an earlier claim holds it.
func (s *snapshot) claim(name string, explicit bool, cert *tls.Certificate) {
	kind, key, addr := classify(name, explicit)
	switch kind {
	case ipName:
		if _, taken := s.ips[addr]; !taken {
			if s.ips == nil {
				s.ips = make(map[netip.Addr]*tls.Certificate)
			}
			s.ips[addr] = cert
		}
		// Also by its text, as upstream does, for clients that put an IP
		// literal in SNI despite RFC 6066.
		if _, taken := s.exact[key]; !taken {
			s.exact[key] = cert
		}
	case wildcardName:
		if _, taken := s.wildcard[key]; !taken {
			if s.wildcard == nil {
				s.wildcard = make(map[string]*tls.Certificate)
			}
			s.wildcard[key] = cert
		}
	default:
		if _, taken := s.exact[key]; !taken {
			s.exact[key] = cert
		}
	}
}

// owner returns the certificate that holds name in the index.
func (s *snapshot) owner(name string, explicit bool) *tls.Certificate {
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
