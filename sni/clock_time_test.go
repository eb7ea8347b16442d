package sni

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestClientCertificatesVerifiedOnTheInjectedClock: the served config
// verifies client certificates on ControllerConfig.Clock, the clock that
// judges the served certificates. A rotating client identity on a clock a
// day ahead of the wall clock (a test's fake clock, stepped) holds a leaf
// that is not yet valid by the wall clock; verified on the wall clock, the
// client was refused with "expired certificate" (found by the gRPC recipe
// test, test/grpc).
func TestClientCertificatesVerifiedOnTheInjectedClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now().Add(24 * time.Hour))
	serverCA := newTestCA(t, clk.Now(), "server-ca")
	serving := newMutable("serving", issueLeaf(t, serverCA, leafSpec{cn: "server", dns: []string{"server.test"}, now: clk.Now()}))
	clientCA := newTestCA(t, clk.Now(), "client-ca")
	clientLeaf := issueLeaf(t, clientCA, leafSpec{cn: "client", now: clk.Now(), lifetime: time.Hour})
	cas := &mutableCA{name: "client-ca"}
	cas.Set(clientCA.CertPEM)

	ctrl, err := NewDynamicServingCertificateController(ControllerConfig{
		Serving: serving, ClientCA: cas, ClientAuth: tls.RequireAndVerifyClientCert, Clock: clk,
	})
	require.NoError(t, err)
	require.NoError(t, ctrl.RunOnce(context.Background()))
	srv := startServer(t, ctrl.TLSConfig())

	cert, err := tls.X509KeyPair(clientLeaf.CertPEM, clientLeaf.KeyPEM)
	require.NoError(t, err)
	cfg := clientConfig(clk, "server.test")
	cfg.Certificates = []tls.Certificate{cert}
	_, err = dial(t, srv.addr, cfg)
	require.NoError(t, err, "a client certificate valid on the controller's clock")

	// And the injected clock, not the wall clock, also refuses: an hour
	// and a minute later the client leaf has expired.
	clk.Step(61 * time.Minute)
	_, err = dial(t, srv.addr, cfg)
	require.Error(t, err, "a client certificate expired on the controller's clock")
}
