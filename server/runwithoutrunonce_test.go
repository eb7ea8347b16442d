package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestRunWithoutRunOnceWritesBundleFile: an embedder that calls Run without
// RunOnce (as Run's documentation allows) gets --ca-bundle-file written and
// HasSynced true once the loops have loaded. Before the fix the writer only
// wrote on a change notification, and the self-signed CA, made when the
// Options were built, never announced one: the file stayed unwritten and
// HasSynced false until the first CA rotation.
func TestRunWithoutRunOnceWritesBundleFile(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	o := NewOptions()
	o.Clock = clk
	o.CABundleFile = filepath.Join(t.TempDir(), "ca.crt")
	s, err := o.Build()
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx, 1)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	require.Eventually(t, s.HasSynced, serveGuard, 10*time.Millisecond, "HasSynced after Run alone")
	onDisk, err := os.ReadFile(o.CABundleFile)
	require.NoError(t, err)
	assert.Equal(t, string(s.TrustBundle.CurrentCABundleContent()), string(onDisk))
}
