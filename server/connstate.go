package server

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// connTracker records the net/http state of every open connection of a
// server (http.Server.ConnState), so that a shutdown that has to cut
// connections can name them. It is safe for concurrent use.
type connTracker struct {
	mu    sync.Mutex
	conns map[net.Conn]trackedConn
}

type trackedConn struct {
	state http.ConnState
	since time.Time
	proto string // ALPN protocol once a request was read; "" before
}

// hook is the http.Server.ConnState function. net/http calls it for
// StateNew before the TLS handshake, then for HTTP/1 on every request and
// for HTTP/2 once the client preface has arrived (an HTTP/2 connection
// still awaiting its preface is reported as new).
func (t *connTracker) hook(c net.Conn, st http.ConnState) {
	var proto string
	if tc, ok := c.(*tls.Conn); ok && (st == http.StateActive || st == http.StateIdle) {
		// The handshake is complete in these states, so this does not
		// wait for the handshake lock.
		proto = tc.ConnectionState().NegotiatedProtocol
		if proto == "" {
			proto = "http/1.1"
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conns == nil {
		t.conns = map[net.Conn]trackedConn{}
	}
	switch st {
	case http.StateClosed, http.StateHijacked:
		// Hijacked connections are no longer the server's to close.
		delete(t.conns, c)
	default:
		t.conns[c] = trackedConn{state: st, since: time.Now(), proto: proto}
	}
}

// open describes the connections open now, sorted by remote address, as
// "ADDR (STATE[, PROTO] for DURATION)".
func (t *connTracker) open() []string {
	t.mu.Lock()
	type entry struct {
		addr string
		trackedConn
	}
	entries := make([]entry, 0, len(t.conns))
	for c, tc := range t.conns {
		entries = append(entries, entry{c.RemoteAddr().String(), tc})
	}
	t.mu.Unlock()
	slices.SortFunc(entries, func(a, b entry) int { return cmp.Compare(a.addr, b.addr) })
	now := time.Now()
	out := make([]string, len(entries))
	for i, e := range entries {
		what := e.state.String()
		if e.proto != "" {
			what += ", " + e.proto
		}
		out[i] = fmt.Sprintf("%s (%s for %s)", e.addr, what, now.Sub(e.since).Round(time.Millisecond))
	}
	return out
}
