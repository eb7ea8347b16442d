package app_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/example/apiserver/app"
)

// startServer builds a server on 127.0.0.1:0 with o (defaults when nil),
// lets setup add handlers, runs it, and waits until /readyz answers 200
// through the loopback client. The server is stopped, and Run awaited, when
// the test ends.
func startServer(t testing.TB, o *app.Options, setup func(*app.Server)) *app.Server {
	t.Helper()
	if o == nil {
		o = app.NewOptions()
	}
	o.SecureServing.BindPort = 0
	s, err := app.NewServer(o)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	if setup != nil {
		setup(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("server Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("server did not stop within 60s")
		}
	})

	hc, err := rest.HTTPClientFor(s.GenericAPIServer.LoopbackClientConfig)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("server stopped early: %v", err)
		default:
		}
		resp, err := hc.Get("https://" + s.Addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not ready within 60s: last error %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// handshake connects to addr with SNI serverName (none when empty) and
// returns the leaf the server presented. With roots set it verifies against
// them at now; without, it only reads the certificate.
func handshake(addr, serverName string, roots *x509.CertPool, now func() time.Time) (*x509.Certificate, error) {
	cfg := &tls.Config{ServerName: serverName, RootCAs: roots, Time: now, NextProtos: []string{"h2"}}
	if roots == nil {
		cfg.InsecureSkipVerify = true // test-only: inspect what is served
	}
	d := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, errors.New("no certificate")
	}
	return certs[0], nil
}

// frozenTimers is a clock whose Now follows the wrapped clock but whose
// timers and tickers never fire: rotation loops started with it stall.
type frozenTimers struct {
	clock.PassiveClock
	frozen clock.WithTicker
}

func (f frozenTimers) After(d time.Duration) <-chan time.Time { return f.frozen.After(d) }
func (f frozenTimers) NewTimer(d time.Duration) clock.Timer   { return f.frozen.NewTimer(d) }
func (f frozenTimers) Sleep(d time.Duration)                  { f.frozen.Sleep(d) }
func (f frozenTimers) Tick(d time.Duration) <-chan time.Time  { return f.frozen.Tick(d) }
func (f frozenTimers) NewTicker(d time.Duration) clock.Ticker { return f.frozen.NewTicker(d) }
