// Package grpc proves the README's gRPC recipe with a real grpc-go server
// and client: evercert owns the server's tls.Config (credentials.NewTLS of
// the sni controller's TLSConfig), so the serving certificate, its CA and
// the client CA all rotate under live RPCs while mutual TLS stays required.
package grpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/rotationtest"
	"github.com/evercert/evercert/sni"
)

const serverName = "grpc.evercert.test"

// TestGRPCRecipe runs a real grpc-go server built by the README recipe
// ("gRPC servers") with evercert's sni controller, a self-signed serving
// provider and a self-signed client identity whose CA is the server's
// client CA, all on one fake clock whose steps their real Run loops follow.
// A real grpc-go client calls the standard health service.
//
// It shows that a client without a certificate, and one whose certificate
// chains to another CA, are refused; that HTTP/2 is negotiated by ALPN
// (grpc-go refuses a connection without it); and that calls keep passing
// through leaf and CA rotations on both sides, on new connections with the
// current and the previous CA bundle, and on a connection opened before
// the first rotation.
func TestGRPCRecipe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	clk := clocktesting.NewFakeClock(time.Now())

	// The server's certificate and the clients' identity both rotate: leaves
	// live an hour (the client's 90 minutes, so that the two sides rotate
	// at different times), CAs eight times as long.
	serving, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Name: "grpc-server", Hosts: []string{serverName}, Lifetime: time.Hour, Clock: clk,
	})
	require.NoError(t, err)
	clientIdentity, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Name: "grpc-client", Hosts: []string{"client.grpc.evercert.test"}, Lifetime: 90 * time.Minute, Clock: clk,
	})
	require.NoError(t, err)
	clientCAs := clientIdentity // its CA bundle is the server's client CA

	// The recipe, word for word but for the test's clock.
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{
		Serving:    serving,   // an Authority, SelfSigned, FileCertKey, SecretCertKey, ...
		ClientCA:   clientCAs, // client certificates must chain to this bundle; it may rotate
		ClientAuth: tls.RequireAndVerifyClientCert,
		Clock:      clk, // test only
	})
	require.NoError(t, err)
	require.NoError(t, ctrl.RunOnce(ctx))
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(ctrl.TLSConfig())))
	// End of the recipe.

	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var loops []chan struct{}
	for _, run := range []func(){
		func() { serving.Run(ctx, 1) },
		func() { clientIdentity.Run(ctx, 1) },
		func() { ctrl.Run(ctx, 1) },
		func() { assert.NoError(t, srv.Serve(ln)) },
	} {
		done := make(chan struct{})
		loops = append(loops, done)
		go func() { defer close(done); run() }()
	}
	t.Cleanup(func() {
		srv.Stop()
		cancel()
		for _, done := range loops {
			<-done
		}
	})
	addr := ln.Addr().String()

	// dial connects a real grpc-go client that trusts bundle, checks the
	// server's certificate on the fake clock and presents the client
	// identity's current leaf on every handshake.
	dial := func(bundle []byte, mutate ...func(*tls.Config)) *grpc.ClientConn {
		roots := x509.NewCertPool()
		require.True(t, roots.AppendCertsFromPEM(bundle))
		cfg := &tls.Config{
			RootCAs: roots, ServerName: serverName, Time: clk.Now,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				cert, key := clientIdentity.CurrentCertKeyContent()
				c, err := tls.X509KeyPair(cert, key)
				return &c, err
			},
		}
		for _, m := range mutate {
			m(cfg)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	// check makes one health call on conn and returns the server's leaf.
	check := func(conn *grpc.ClientConn) (*x509.Certificate, error) {
		callCtx, done := context.WithTimeout(ctx, 10*time.Second)
		defer done()
		var p peer.Peer
		resp, err := healthpb.NewHealthClient(conn).Check(callCtx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		if err != nil {
			return nil, err
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return nil, fmt.Errorf("health status %v", resp.GetStatus())
		}
		info, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok {
			return nil, fmt.Errorf("peer auth info %T, want credentials.TLSInfo", p.AuthInfo)
		}
		if got := info.State.NegotiatedProtocol; got != "h2" {
			return nil, fmt.Errorf("negotiated protocol %q, want h2", got)
		}
		return info.State.PeerCertificates[0], nil
	}
	// refused expects a fresh connection made by dial(bundle, mutate...) to
	// fail its first call.
	refused := func(what string, bundle []byte, mutate func(*tls.Config)) {
		t.Helper()
		_, err := check(dial(bundle, mutate))
		require.Error(t, err, "%s must be refused: the server requires a client certificate from its client CA", what)
	}
	noCert := func(c *tls.Config) { c.GetClientCertificate = nil }
	stranger, err := pki.NewCA(pki.Request{CommonName: "stranger-ca", Now: clk.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	strangerLeaf, err := pki.IssueLeaf(stranger, pki.Request{CommonName: "stranger", Now: clk.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	strangerCert, err := tls.X509KeyPair(strangerLeaf.CertPEM, strangerLeaf.KeyPEM)
	require.NoError(t, err)
	otherCA := func(c *tls.Config) {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &strangerCert, nil }
	}

	early := dial(serving.CurrentCABundleContent())
	_, err = check(early)
	require.NoError(t, err, "the first call")
	refused("a client without a certificate", serving.CurrentCABundleContent(), noCert)
	refused("a client whose certificate chains to another CA", serving.CurrentCABundleContent(), otherCA)

	// Step the fake clock through 9 hours in 10-minute steps. After each
	// step, wait until both providers have caught up and the controller
	// serves the current leaf, then call on new connections that trust the
	// current and the previous bundle, and on the early connection.
	serverLeaves, serverCAs, clientLeaves, clientCAsSeen := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	previous := serving.CurrentCABundleContent()
	for step := range 54 {
		clk.Step(10 * time.Minute)
		var leaf *x509.Certificate
		require.Eventually(t, func() bool {
			if !rotationtest.Settled(serving, clk.Now()) || !rotationtest.Settled(clientIdentity, clk.Now()) {
				return false
			}
			leaf = serving.Leaf()
			return rotationtest.DefaultServedSerial(ctrl) == leaf.SerialNumber.Text(16)
		}, 30*time.Second, 5*time.Millisecond, "step %d: the providers did not settle, or the leaf is not served", step)
		serverLeaves[leaf.SerialNumber.Text(16)] = true
		serverCAs[string(leaf.AuthorityKeyId)] = true
		clientLeaf := clientIdentity.Leaf()
		clientLeaves[clientLeaf.SerialNumber.Text(16)] = true
		clientCAsSeen[string(clientLeaf.AuthorityKeyId)] = true

		current := serving.CurrentCABundleContent()
		for name, bundle := range map[string][]byte{"current": current, "previous": previous} {
			got, err := check(dial(bundle))
			require.NoError(t, err, "step %d, a new connection trusting the %s bundle", step, name)
			require.Equal(t, 0, got.SerialNumber.Cmp(leaf.SerialNumber), "step %d: served leaf", step)
		}
		_, err := check(early)
		require.NoError(t, err, "step %d: the connection opened before the first rotation", step)
		previous = current
	}
	t.Logf("server: %d leaves signed by %d CAs; client identity: %d leaves signed by %d CAs",
		len(serverLeaves), len(serverCAs), len(clientLeaves), len(clientCAsSeen))
	assert.GreaterOrEqual(t, len(serverLeaves), 10, "server leaf rotations")
	assert.GreaterOrEqual(t, len(serverCAs), 3, "server CA rotations")
	assert.GreaterOrEqual(t, len(clientLeaves), 6, "client leaf rotations")
	assert.GreaterOrEqual(t, len(clientCAsSeen), 2, "client CA rotations")

	// Still mutual TLS after all of it.
	refused("a client without a certificate", serving.CurrentCABundleContent(), noCert)
	refused("a client whose certificate chains to another CA", serving.CurrentCABundleContent(), otherCA)
}
