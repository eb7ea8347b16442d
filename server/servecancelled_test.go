package server

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestServeCancelledBeforeStart: a context that ends before Serve has
// loaded anything (a SIGTERM during start-up) is a clean shutdown, as
// Serve's documentation says of a context that ends: nil, and no listener.
// Before the fix Serve returned "no serving certificate: context
// canceled", although the certificate was fine, so the process exited
// non-zero blaming its certificate.
func TestServeCancelledBeforeStart(t *testing.T) {
	o := NewOptions()
	o.Clock = clocktesting.NewFakeClock(time.Now())
	o.BindAddress = []byte{127, 0, 0, 1}
	o.SecurePort = 0
	s, err := o.Build()
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, http.NotFoundHandler()) }()
	select {
	case err := <-done:
		require.NoError(t, err, "a context that ended is a shutdown, not a start-up failure")
	case <-time.After(serveGuard):
		t.Fatalf("Serve did not return within %v of its context ending", serveGuard)
	}
	select {
	case <-s.Listening():
		t.Fatal("Serve listened although its context had ended")
	default:
	}
	assert.Nil(t, s.Addr())
}
