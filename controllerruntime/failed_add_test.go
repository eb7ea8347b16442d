package controllerruntime

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/evercert/evercert/authority"
)

// TestFailedAddLeavesTheSourceAlone: an Add that fails because the manager
// refuses its checks (Add after Start)
// changes nothing, not even the provider the caller passed in. Before, it
// had already added its publisher, which no manager would ever run, as an
// observer of Config.CABundle: every successor CA of that provider then
// waited for it until the signing CA was about to expire, and each CA
// rotation was an unsafe one.
func TestFailedAddLeavesTheSourceAlone(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ss, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Hosts: []string{"webhook.test"}, Lifetime: time.Hour, CALifetime: 3 * time.Hour, PropagationDelay: time.Minute, Clock: clk,
	})
	require.NoError(t, err)

	mgr, _, _ := startedManager(t)
	certs, err := Add(mgr, Config{Source: ss, CABundle: ss, ValidatingWebhooks: []string{"x"}})
	require.Error(t, err, "Add after Start")
	assert.Nil(t, certs)
	assert.Contains(t, err.Error(), "call Add before the manager starts")

	// The provider's own Run loop through its first CA rotation: the
	// successor waits for nobody but the propagation delay.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ss.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	first := ""
	require.Eventually(t, func() bool { first = ss.Status().Signing.Fingerprint; return first != "" }, time.Minute, 10*time.Millisecond)
	// Step to an hour before the CA's end (CARenewBefore: the successor
	// is published), then in small increments while polling, so that a
	// timer the Run loop sets after a step fires on a later one: the
	// successor signs after the propagation delay, waiting for nobody.
	require.Eventually(t, clk.HasWaiters, time.Minute, 10*time.Millisecond)
	clk.Step(2 * time.Hour)
	var pending []string
	require.Eventually(t, func() bool {
		st := ss.Status()
		if st.Signing.Fingerprint != first {
			return true
		}
		if st.Successor != nil && len(st.Successor.Pending) > 0 {
			pending = st.Successor.Pending
		}
		clk.Step(5 * time.Second)
		return false
	}, 2*time.Minute, 10*time.Millisecond, "the successor never signed: %+v", ss.Status().Successor)
	assert.Empty(t, pending, "observers the successor waited for")
	assert.Zero(t, ss.Status().UnsafeRotations)
}

// TestSecondAddIsRefused: a second Add on one manager returns an error and
// changes nothing. Before, it succeeded: the manager replaced the first
// call's "evercert" checks with the second's, and the webhook server got a
// second GetCertificate (the last one wins), so it served the second
// call's leaf while the first call's publisher kept the first CA in the
// first call's targets, and /readyz said nothing about them.
func TestSecondAddIsRefused(t *testing.T) {
	first, err := authority.NewSelfSigned(authority.SelfSignedConfig{Hosts: []string{"first.test"}})
	require.NoError(t, err)
	second, err := authority.NewSelfSigned(authority.SelfSignedConfig{Hosts: []string{"second.test"}})
	require.NoError(t, err)
	mgr := offlineManager(t)
	ws := mgr.GetWebhookServer().(*webhook.DefaultServer)

	_, err = Add(mgr, Config{Source: first, CABundle: first, ValidatingWebhooks: []string{"first"}})
	require.NoError(t, err, "the first Add")
	certs, err := Add(mgr, Config{Source: second})
	require.Error(t, err, "a second Add on one manager")
	assert.Nil(t, certs)
	assert.Contains(t, err.Error(), "already called on this manager")
	assert.Len(t, ws.Options.TLSOpts, 1, "only the first Add's option")

	// A refused Add does not claim the manager: after a bad Config, the
	// good one is accepted.
	other := offlineManager(t)
	_, err = Add(other, Config{Source: second, CRDs: []string{"widgets.example.com"}})
	require.ErrorContains(t, err, "Config.CABundle is required")
	_, err = Add(other, Config{Source: second})
	require.NoError(t, err)
}
