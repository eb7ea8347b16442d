package loopback_test

import (
	"crypto/tls"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"
)

// tlsServer serves whatever p holds now, parsing it on every handshake, over
// HTTP/2 on 127.0.0.1. The handler answers 200 "ok" to requests carrying
// "Bearer token" and 401 to the rest, and echoes the User-Agent.
func tlsServer(t testing.TB, p interface{ CurrentCertKeyContent() ([]byte, []byte) }, token string) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-User-Agent", r.UserAgent())
		w.Header().Set("X-Proto", r.Proto)
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		cert, key := p.CurrentCertKeyContent()
		c, err := tls.X509KeyPair(cert, key)
		return &c, err
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// serialRecorder records the serial of the server leaf each response came
// over, as seen (and verified) by the client.
type serialRecorder struct {
	rt     http.RoundTripper
	serial *atomic.Pointer[big.Int]
}

func (s serialRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.rt.RoundTrip(req)
	if err == nil && resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		s.serial.Store(resp.TLS.PeerCertificates[0].SerialNumber)
	}
	return resp, err
}

// recordSerials wraps cfg (in place) so responses record the served serial.
func recordSerials(cfg *rest.Config) *atomic.Pointer[big.Int] {
	p := new(atomic.Pointer[big.Int])
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return serialRecorder{rt: rt, serial: p} })
	return p
}
