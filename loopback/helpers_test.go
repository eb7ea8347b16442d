package loopback_test

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
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
