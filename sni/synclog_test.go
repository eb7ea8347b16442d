package sni

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/logtest"
)

// TestFailingSyncLoggedOnce: while nothing can be served, Run retries the
// sync with the queue's rate limiter; the failure is one error line however
// often it is retried, and its end is one info line.
func TestFailingSyncLoggedOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	p := newMutable("serving", nil)
	p.setQuietly([]byte("not pem"), []byte("not pem"))
	c := newController(t, ControllerConfig{Serving: p, Clock: clk})

	_, ctx, logs := logtest.New(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(ctx, 1); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	// The rate limiter retries after 5 ms, 10 ms, 20 ms, ...: wait for a
	// few retries of the same failure.
	require.Eventually(t, func() bool { return c.queue.NumRequeues(workItemKey) >= 5 }, 30*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, logs.Errors("Initial certificate sync failed")+logs.Errors("Certificate sync failed"),
		"one error line for %d retries of one failure:\n%s", c.queue.NumRequeues(workItemKey), logs)

	ca := newTestCA(t, clk.Now(), "ca")
	p.SetIssued(issueLeaf(t, ca, leafSpec{cn: "default.test", now: clk.Now()}))
	require.Eventually(t, c.HasSynced, 30*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return logs.Infos("Certificate sync succeeded again") == 1 }, 30*time.Second, 5*time.Millisecond)
}
