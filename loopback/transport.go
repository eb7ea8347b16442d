package loopback

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/evercert/evercert/internal/pki"
)

// handshakeTimeout bounds the TLS handshake of a loopback connection, like
// client-go's TLSHandshakeTimeout.
const handshakeTimeout = 10 * time.Second

// trust verifies loopback servers against the current CA bundle. The parsed
// pool is cached by bundle content, so a connection only parses the bundle
// when it changed since the previous connection.
type trust struct {
	bundle func() []byte
	now    func() time.Time
	cached atomic.Pointer[pool]
}

type pool struct {
	bundle []byte
	pool   *x509.CertPool
	// names are the common names of the CAs in the bundle, for errors.
	names []string
}

func (t *trust) pool() (*x509.CertPool, error) {
	b := t.bundle()
	if p := t.cached.Load(); p != nil && bytes.Equal(p.bundle, b) {
		return p.pool, nil
	}
	certPool, certs, err := pki.NewPool(b)
	if err != nil {
		return nil, fmt.Errorf("loopback CA bundle: %w", err)
	}
	names := make([]string, len(certs))
	for i, c := range certs {
		names[i] = c.Subject.CommonName
	}
	t.cached.Store(&pool{bundle: b, pool: certPool, names: names})
	return certPool, nil
}

// explain adds to a handshake error in which the server's certificate does
// not chain to the trust bundle which CA issued it and which CAs the bundle
// holds. evercert names its CAs "<provider>-ca@<unix seconds>", so this
// tells the two sides' CAs apart (a second server on the loopback port, a
// bundle that did not follow a rotation).
func (t *trust) explain(err error) error {
	var ua x509.UnknownAuthorityError
	if !errors.As(err, &ua) || ua.Cert == nil {
		return err
	}
	var trusted []string
	if p := t.cached.Load(); p != nil {
		trusted = p.names
	}
	return fmt.Errorf("server certificate %q was issued by %q, which is not in the loopback trust bundle %q: %w",
		ua.Cert.Subject.CommonName, ua.Cert.Issuer.CommonName, trusted, err)
}

// tlsConfig returns the client configuration for one new connection: the
// current bundle as roots, ServerName as SNI and verified name, and the
// injected clock as the time validity is checked at. Verification is Go's
// standard one; nothing is skipped.
func (t *trust) tlsConfig(nextProtos []string) (*tls.Config, error) {
	roots, err := t.pool()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		RootCAs:    roots,
		ServerName: ServerName,
		NextProtos: nextProtos,
		MinVersion: tls.VersionTLS12,
		Time:       t.now,
	}, nil
}

// newTransport returns the HTTP transport every loopback request goes
// through. It dials TLS itself (DialTLSContext), so each connection gets a
// tls.Config built from the bundle current at dial time; HTTP/2 is
// configured like client-go's transports (utilnet.SetTransportDefaults:
// h2 with connection health checks, DISABLE_HTTP2 honoured). The loopback is
// never proxied.
func newTransport(t *trust) *http.Transport {
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:               func(*http.Request) (*url.URL, error) { return nil, nil },
		DialContext:         dialer.DialContext,
		TLSHandshakeTimeout: handshakeTimeout,
		MaxIdleConnsPerHost: 25, // as client-go
	}
	tr = utilnet.SetTransportDefaults(tr)
	// Offer h2 only when the transport can speak it on the connection.
	nextProtos := []string{"http/1.1"}
	if _, ok := tr.TLSNextProto["h2"]; ok {
		nextProtos = []string{"h2", "http/1.1"}
	}
	tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg, err := t.tlsConfig(nextProtos)
		if err != nil {
			return nil, err
		}
		raw, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
		defer cancel()
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(hctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("loopback TLS handshake with %s: %w", addr, t.explain(err))
		}
		return conn, nil
	}
	return tr
}

// WrapTransport is the rest.Config.WrapTransport of every loopback config.
// It sends requests through the Certificate's rotating transport instead of
// rt, the transport client-go built from the config's static TLS fields.
// Upgrade requests (SPDY, websockets) still go to rt, because their round
// trippers dial and speak the upgraded protocol themselves; they verify
// against the CAData snapshot taken when the config was made.
//
// Use it to give any rest.Config for this server rotating trust, e.g. after
// rest.AnonymousClientConfig, which drops WrapTransport. Wrappers added later
// with rest.Config.Wrap are layered on top, as usual.
func (c *Certificate) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	return &roundTripper{rotating: c.transport, static: rt}
}

type roundTripper struct {
	rotating *http.Transport
	static   http.RoundTripper
}

var _ utilnet.RoundTripperWrapper = &roundTripper{}

func (r *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.static != nil && httpstream.IsUpgradeRequest(req) {
		return r.static.RoundTrip(req)
	}
	return r.rotating.RoundTrip(req)
}

// WrappedRoundTripper returns the transport normal requests go through.
func (r *roundTripper) WrappedRoundTripper() http.RoundTripper { return r.rotating }

// CloseIdleConnections closes the idle connections of both transports.
func (r *roundTripper) CloseIdleConnections() {
	r.rotating.CloseIdleConnections()
	if r.static != nil {
		utilnet.CloseIdleConnectionsFor(r.static)
	}
}
