// Package tlstest runs real TLS servers and handshakes on 127.0.0.1 for
// evercert's tests.
package tlstest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server accepts TLS connections on 127.0.0.1 with config, completes the
// handshake, writes one byte so the client knows the server side finished,
// and closes. It stops when the test ends.
func Server(t testing.TB, config *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening on 127.0.0.1: %v", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				tc := tls.Server(conn, config)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if tc.Handshake() == nil {
					_, _ = tc.Write([]byte{1})
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// Handshake dials addr with config, completes a TLS handshake and returns
// the leaf certificate the server presented.
func Handshake(addr string, config *tls.Config) (*x509.Certificate, error) {
	st, err := HandshakeState(addr, config)
	if err != nil {
		return nil, err
	}
	return st.PeerCertificates[0], nil
}

// HandshakeState is Handshake returning the whole connection state: the
// chain the server sent (PeerCertificates) and, unless config skips
// verification, the chains the client built (VerifiedChains).
func HandshakeState(addr string, config *tls.Config) (tls.ConnectionState, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, config)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	// Reading the server's byte surfaces a server-side rejection of our
	// client certificate, which TLS 1.3 reports only after the handshake.
	if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
		return tls.ConnectionState{}, err
	}
	st := conn.ConnectionState()
	if len(st.PeerCertificates) == 0 {
		return tls.ConnectionState{}, errors.New("server presented no certificate")
	}
	return st, nil
}

// Pool returns a CertPool holding the PEM certificates in bundle, failing the
// test if there are none.
func Pool(t testing.TB, bundle []byte) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatalf("no certificates in CA bundle")
	}
	return pool
}

// Dial completes a TLS handshake with any TLS server at addr (an HTTP server,
// say, that sends nothing first) and returns the leaf it presented. Unlike
// Handshake it cannot see a TLS 1.3 server's late rejection of a client
// certificate.
func Dial(addr string, config *tls.Config) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, config)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, errors.New("server presented no certificate")
	}
	return certs[0], nil
}

// OpenSSL completes a TLS handshake with the server at addr using the
// openssl s_client command, a client independent of Go's crypto/tls, and
// returns the leaf the server presented. serverName is sent as SNI; empty
// sends none. args are added to the command line, e.g. "-tls1_3",
// "-sigalgs", "rsa_pss_rsae_sha256" to offer only RSA-PSS signatures. The
// certificate is not verified: callers check which one they got. The test
// fails if openssl is not installed (hack/install-deps.sh installs it).
func OpenSSL(t testing.TB, addr, serverName string, args ...string) (*x509.Certificate, error) {
	t.Helper()
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Fatalf("openssl is required (make deps): %v", err)
	}
	cmdArgs := []string{"s_client", "-connect", addr}
	if serverName == "" {
		cmdArgs = append(cmdArgs, "-noservername")
	} else {
		cmdArgs = append(cmdArgs, "-servername", serverName)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(cmdArgs, args...)...)
	cmd.Stdin = strings.NewReader("") // EOF at once: s_client closes after the handshake
	out, err := cmd.CombinedOutput()
	block, _ := pem.Decode(out[max(0, bytes.Index(out, []byte("-----BEGIN CERTIFICATE-----"))):])
	if block == nil {
		return nil, fmt.Errorf("openssl %s: no server certificate (%v):\n%s", strings.Join(cmd.Args[1:], " "), err, out)
	}
	return x509.ParseCertificate(block.Bytes)
}

// Exchange opens a new connection to addr, completes a TLS handshake with
// config, sends close_notify and reads until the server closes the
// connection, and returns the connection's state. By then the server has
// done all it does for a client that connects and sends no request: the
// handshake (with the verification of a client certificate, which TLS 1.3
// does after the client has finished), the session ticket, an HTTP
// server's connection set-up, and the close. A rejection of the client
// certificate is returned as the error.
func Exchange(addr string, config *tls.Config) (tls.ConnectionState, error) {
	raw, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	conn := tls.Client(raw, config)
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return tls.ConnectionState{}, err
	}
	if err := conn.Handshake(); err != nil {
		return tls.ConnectionState{}, fmt.Errorf("handshake with %s: %w", addr, err)
	}
	if err := conn.CloseWrite(); err != nil {
		return tls.ConnectionState{}, fmt.Errorf("close_notify to %s: %w", addr, err)
	}
	if _, err := io.Copy(io.Discard, conn); err != nil {
		return tls.ConnectionState{}, fmt.Errorf("reading from %s: %w", addr, err)
	}
	return conn.ConnectionState(), nil
}
