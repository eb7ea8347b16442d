//go:build e2e

package e2e

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// backend is one replica behind the proxy. routable stands for the
// replica's Endpoint being ready: the test's prober sets it from the
// replica's /readyz, as the kubelet's readiness probe would.
type backend struct {
	name     string
	addr     atomic.Pointer[string] // host:port; set again when the replica moves to new ports
	routable atomic.Bool
	conns    atomic.Int64 // connections the proxy sent to it
}

// setAddr points the backend at host:port addr.
func (b *backend) setAddr(addr string) { b.addr.Store(&addr) }

// roundRobin is a TCP proxy on 127.0.0.1 that stands in for the operator's
// Service: the kube-apiserver calls one address, and each connection goes
// to the next routable backend in turn. A backend that is not routable, or
// refuses the connection (a killed replica), is skipped. TLS passes through
// untouched: the kube-apiserver verifies the replica's own leaf.
type roundRobin struct {
	ln       net.Listener
	backends []*backend
	next     atomic.Uint64
	noRoute  atomic.Int64 // connections no backend took

	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, backends []*backend) *roundRobin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &roundRobin{ln: ln, backends: backends, open: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(p.stop)
	return p
}

func (p *roundRobin) addr() string { return p.ln.Addr().String() }

func (p *roundRobin) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed by stop
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() { p.relay(c) })
	}
}

// track registers c so stop can close it; false once stopped.
func (p *roundRobin) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.open[c] = struct{}{}
	return true
}

func (p *roundRobin) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.open, c)
}

// dial connects to the next routable backend that accepts, trying each
// at most once.
func (p *roundRobin) dial() (net.Conn, *backend) {
	start := p.next.Add(1)
	for i := range uint64(len(p.backends)) {
		b := p.backends[(start+i)%uint64(len(p.backends))]
		if !b.routable.Load() {
			continue
		}
		c, err := net.DialTimeout("tcp", *b.addr.Load(), 2*time.Second)
		if err != nil {
			continue
		}
		return c, b
	}
	return nil, nil
}

func (p *roundRobin) relay(client net.Conn) {
	defer p.untrack(client)
	defer client.Close()
	server, b := p.dial()
	if server == nil {
		p.noRoute.Add(1)
		return
	}
	b.conns.Add(1)
	if !p.track(server) {
		_ = server.Close()
		return
	}
	defer p.untrack(server)
	defer server.Close()
	// When either side ends, close both: a killed replica's connections
	// are closed towards the kube-apiserver at once, as its own would be.
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	_ = client.Close()
	_ = server.Close()
	<-done
}

func (p *roundRobin) stop() {
	p.mu.Lock()
	p.closed = true
	for c := range p.open {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}
