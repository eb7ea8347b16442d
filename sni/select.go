package sni

import (
	"crypto/tls"
	"net"
	"net/netip"
	"strings"
)

// getCertificate is the snapshot's tls.Config.GetCertificate. It runs on
// every handshake and does not allocate when the SNI name is already lower
// case (strings.ToLower returns its argument unchanged then), which is what
// clients send in practice, and the match has one certificate, or several
// of which the first fits the client (see choice.pick).
//
// Order: exact name, single-label wildcard, (no SNI) explicit local IP,
// default. It never returns nil: the default always exists in a snapshot.
func (s *snapshot) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.choose(hello).pick(hello), nil
}

// choose returns what hello's server name, or local IP, selects.
func (s *snapshot) choose(hello *tls.ClientHelloInfo) *choice {
	if hello.ServerName != "" {
		name := strings.ToLower(hello.ServerName)
		if c, ok := s.exact[name]; ok {
			return c
		}
		if len(s.wildcard) > 0 {
			// Only the first label is replaced, so *.example.com matches
			// a.example.com but neither a.b.example.com (suffix
			// b.example.com) nor example.com (suffix com). A name with no
			// dot has the empty suffix, which only "*" claims.
			suffix, ok := "", true
			if i := strings.IndexByte(name, '.'); i >= 0 {
				suffix, ok = name[i+1:], i > 0
			}
			if ok {
				if c, ok := s.wildcard[suffix]; ok {
					return c
				}
			}
		}
		return s.def
	}
	if len(s.ips) > 0 {
		if addr, ok := localIP(hello.Conn); ok {
			if c, ok := s.ips[addr]; ok {
				return c
			}
		}
	}
	return s.def
}

// localIP returns the IP of conn's local address, unmapped and without a
// zone, so that it compares equal to the parsed explicit names. It reads the
// address without formatting it, so it does not allocate.
func localIP(conn net.Conn) (netip.Addr, bool) {
	if conn == nil {
		return netip.Addr{}, false
	}
	var ip net.IP
	switch a := conn.LocalAddr().(type) {
	case *net.TCPAddr:
		ip = a.IP
	case *net.UDPAddr:
		ip = a.IP
	default:
		return netip.Addr{}, false
	}
	addr, ok := netip.AddrFromSlice(ip)
	return addr.Unmap(), ok
}
