package server

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/logtest"
)

func bundleFileWrites(t *testing.T, result string) float64 {
	t.Helper()
	return certmetricstest.Value(t, "evercert_cabundle_publish_total", map[string]string{"kind": "CABundleFile", "result": result})
}

// TestCABundleFileRetriedUntilWritten runs the real Serving loops on a fake
// clock. After start-up the bundle file's directory is replaced by a
// regular file, so writes fail; a CA rotation then cannot be written, which
// is counted. Once the directory is back, the new bundle reaches the file
// with no further rotation, only by stepping the clock past the backoff.
// The failure, retried several times, is logged once on the logger of
// Serve's context, and so is the recovery.
func TestCABundleFileRetriedUntilWritten(t *testing.T) {
	_, ctx, logs := logtest.New(t)
	clk := clocktesting.NewFakeClock(time.Now())
	dir := filepath.Join(t.TempDir(), "bundle")
	require.NoError(t, os.Mkdir(dir, 0o755))
	o := NewOptions()
	o.Clock = clk
	// Leaf 24h, CA 72h: the successor CA joins the bundle at 48h and the
	// next event after that is 8h later, far beyond the steps below.
	o.SelfSignedValidity = 24 * time.Hour
	o.CABundleFile = filepath.Join(dir, "ca.crt")
	r := startWithContext(t, ctx, o, nil)

	initial, err := os.ReadFile(o.CABundleFile)
	require.NoError(t, err)
	require.Equal(t, string(r.serving.TrustBundle.CurrentCABundleContent()), string(initial))
	errorsBefore, successBefore := bundleFileWrites(t, "error"), bundleFileWrites(t, "success")

	// Make every write fail: the directory becomes a regular file.
	moved := dir + ".moved"
	require.NoError(t, os.Rename(dir, moved))
	require.NoError(t, os.WriteFile(dir, []byte("not a directory"), 0o644))

	// Rotate: the successor CA joins the bundle.
	clk.Step(48*time.Hour + time.Minute)
	var rotated []byte
	require.Eventually(t, func() bool {
		rotated = r.serving.TrustBundle.CurrentCABundleContent()
		return !bytes.Equal(rotated, initial)
	}, serveGuard, 10*time.Millisecond, "the CA bundle did not change")
	assert.Eventually(t, func() bool { return bundleFileWrites(t, "error") > errorsBefore }, serveGuard, 10*time.Millisecond,
		"the failed write is counted in evercert_cabundle_publish_total{kind=CABundleFile,result=error}")
	// Let the retries fail a few more times.
	assert.Eventually(t, func() bool {
		clk.Step(time.Second)
		return bundleFileWrites(t, "error") >= errorsBefore+3
	}, serveGuard, 20*time.Millisecond, "the failed write was not retried")
	assert.Equal(t, 1, logs.Errors("Writing CA bundle file failed"),
		"a failure retried with backoff is logged once:\n%s", logs)
	onDisk, err := os.ReadFile(filepath.Join(moved, "ca.crt"))
	require.NoError(t, err)
	assert.Equal(t, string(initial), string(onDisk), "no write happened while the directory was gone")

	// Repair, then only step the clock (1s at a time, well within the 8h
	// before the next rotation): the retry writes the new bundle.
	rotationsBefore := certmetricstest.Rotations(t, "self-signed")
	require.NoError(t, os.Remove(dir))
	require.NoError(t, os.Rename(moved, dir))
	var stepped time.Duration
	assert.Eventually(t, func() bool {
		clk.Step(time.Second)
		stepped += time.Second
		b, err := os.ReadFile(o.CABundleFile)
		return err == nil && bytes.Equal(b, rotated)
	}, serveGuard, 20*time.Millisecond, "the bundle file never got the rotated bundle without a further rotation")
	t.Logf("stepped the clock by %v after the repair", stepped)
	assert.Equal(t, string(rotated), string(r.serving.TrustBundle.CurrentCABundleContent()), "the bundle did not change again")
	assert.Equal(t, rotationsBefore, certmetricstest.Rotations(t, "self-signed"), "no further rotation happened")
	assert.Greater(t, bundleFileWrites(t, "success"), successBefore, "the successful retry is counted")
	assert.Equal(t, 1, logs.Infos("Wrote CA bundle file after failures"), "the recovery is logged once:\n%s", logs)
	assert.Equal(t, 1, logs.Errors("Writing CA bundle file failed"), "the failure is not logged again:\n%s", logs)
}
