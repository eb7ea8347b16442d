package sni

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"
)

// frameworkRecipe is how the README tells users to plug the controller into
// a framework-owned config (controller-runtime's TLSOpts). The field trial
// found that the previous recipe (setting GetConfigForClient) silently
// replaced the framework's whole config.
func frameworkRecipe(c *DynamicServingCertificateController) func(*tls.Config) {
	return c.SetGetCertificate
}

// TestFrameworkSettingsSurviveRecipe builds a config the way a framework
// does (client certificates required, TLS 1.3 floor, HTTP/2 off), applies
// the recipe, and checks with real handshakes that every framework setting
// holds while the certificate still rotates through the controller's Run
// loop.
func TestFrameworkSettingsSurviveRecipe(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "framework-ca")
	first := issueLeaf(t, ca, leafSpec{cn: "webhook.test", dns: []string{"webhook.test"}, now: clk.Now()})
	provider := newMutable("webhook", first)
	// The controller's own base would allow TLS 1.2, HTTP/2 and no client
	// certificate: none of it may leak into the framework's config.
	c := newController(t, ControllerConfig{
		Base:    &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}},
		Serving: provider,
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{},
		Clock:   clk,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, c.HasSynced, 30*time.Second, 5*time.Millisecond)

	clientCA := newTestCA(t, clk.Now(), "framework-client-ca")
	alice := issueLeaf(t, clientCA, leafSpec{cn: "alice", now: clk.Now()})
	aliceCert, err := tls.X509KeyPair(alice.CertPEM, alice.KeyPEM)
	require.NoError(t, err)

	framework := &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  x509Pool(t, clientCA),
		NextProtos: []string{"http/1.1"}, // kubebuilder's "disable HTTP/2"
	}
	frameworkRecipe(c)(framework)
	srv := startServer(t, framework)

	client := func() *tls.Config {
		cfg := clientConfig(clk, "webhook.test")
		cfg.InsecureSkipVerify = false
		cfg.RootCAs = x509Pool(t, ca)
		cfg.Certificates = []tls.Certificate{aliceCert}
		cfg.NextProtos = []string{"h2", "http/1.1"}
		return cfg
	}

	st, err := dial(t, srv.addr, client())
	require.NoError(t, err)
	requireSerial(t, first, st.PeerCertificates[0].SerialNumber)
	require.Equal(t, "http/1.1", st.NegotiatedProtocol, "HTTP/2 was switched off by the framework")
	require.Equal(t, uint16(tls.VersionTLS13), st.Version)

	noCert := client()
	noCert.Certificates = nil
	_, err = dial(t, srv.addr, noCert)
	require.Error(t, err, "a client without a certificate must be refused: the framework requires one")

	tls12 := client()
	tls12.MaxVersion = tls.VersionTLS12
	_, err = dial(t, srv.addr, tls12)
	require.Error(t, err, "a TLS 1.2 client must be refused: the framework's floor is TLS 1.3")

	// Rotation still flows through the controller's queue and worker.
	next := issueLeaf(t, ca, leafSpec{cn: "webhook.test", dns: []string{"webhook.test"}, now: clk.Now()})
	provider.SetIssued(next)
	require.Eventually(t, func() bool {
		st, err := dial(t, srv.addr, client())
		return err == nil && st.PeerCertificates[0].SerialNumber.Cmp(next.Cert.SerialNumber) == 0
	}, 30*time.Second, 10*time.Millisecond)
}
