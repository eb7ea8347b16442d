package controllerruntime

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// TestChecksFollowTheServedCertificate shows the two checks on a served
// certificate that expires (a static source on a fake clock, no targets):
// the liveness check passes before the first certificate and while it is
// valid, and fails once it has expired; the ready check fails until a
// certificate is served and Ready is closed, passes then, and fails again
// once it has expired.
func TestChecksFollowTheServedCertificate(t *testing.T) {
	now := time.Now()
	clk := clocktesting.NewFakeClock(now)
	ca, err := pki.NewCA(pki.Request{CommonName: "checks-ca", Now: now, Lifetime: 2 * time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "webhook.test", DNSNames: []string{"webhook.test"}, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	static, err := dynamiccert.NewStaticCertKey(dynamiccert.StaticCertKeyConfig{Name: "static", Cert: leaf.CertPEM, Key: leaf.KeyPEM})
	require.NoError(t, err)

	certs, err := Add(offlineManager(t), Config{Source: static, Clock: clk})
	require.NoError(t, err)
	healthz, readyz := certs.HealthzCheck(), certs.ReadyzCheck()
	assert.NoError(t, healthz(nil), "live before the first certificate")
	assert.ErrorContains(t, readyz(nil), "no certificate served yet")

	// What the Runnables do, without a manager: serve, then open the gate.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, certs.ctrl.RunOnce(ctx))
	certs.waitReady(ctx)
	select {
	case <-certs.Ready():
	default:
		t.Fatal("Ready not closed once a certificate is served (no targets)")
	}
	assert.NoError(t, healthz(nil))
	assert.NoError(t, readyz(nil))

	clk.Step(time.Hour + time.Second)
	assert.ErrorContains(t, healthz(nil), "the served certificate webhook.test (serial "+leaf.Cert.SerialNumber.Text(16)+") expired at")
	assert.ErrorContains(t, readyz(nil), "expired at")
}
