package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
)

// TestBundleFileIsAnObserver: with --ca-bundle-file, a successor CA signs
// only once the file holds it. The file's directory is made unwritable (a
// regular file where the directory was) when the successor is published;
// the successor must not sign while the file cannot get it, and must sign
// once the write succeeds, through the real Run loops on a fake clock.
func TestBundleFileIsAnObserver(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	dir := filepath.Join(t.TempDir(), "bundle")
	require.NoError(t, os.Mkdir(dir, 0o755))
	o := NewOptions()
	o.SecurePort = 0
	o.SelfSignedValidity = time.Hour
	o.CABundleFile = filepath.Join(dir, "ca.crt")
	o.Clock = clk
	s, err := o.Build()
	require.NoError(t, err)
	ss := s.TrustBundle.(*authority.SelfSigned)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, s.RunOnce(ctx))
	done := make(chan struct{})
	go func() { s.Run(ctx, 1); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	step := func() {
		clk.Step(time.Minute)
		time.Sleep(2 * time.Millisecond) // let the loops run; not a timing assertion
	}
	// Break the file's directory just before the successor is published.
	publishAt := ss.Status().Signing.NotAfter.Add(-ss.Config().CARenewBefore)
	for clk.Now().Add(time.Minute).Before(publishAt) {
		step()
	}
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.WriteFile(dir, []byte("not a directory"), 0o644))
	for ss.Status().Successor == nil {
		step()
	}
	succ := ss.Status().Successor
	for clk.Now().Before(succ.SignsNoEarlierThan.Add(30 * time.Minute)) {
		step()
		st := ss.Status()
		require.NotNil(t, st.Successor, "the successor signed although the bundle file never got it")
		require.Contains(t, st.Successor.Pending, "ca-bundle-file")
	}
	require.NoError(t, os.Remove(dir))
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.Eventually(t, func() bool {
		step()
		return ss.Status().Successor == nil
	}, 30*time.Second, time.Millisecond, "promotion once the file holds the successor")
	written, err := os.ReadFile(o.CABundleFile)
	require.NoError(t, err)
	certs, err := pki.ParseCABundle(written)
	require.NoError(t, err)
	var fingerprints []string
	for _, c := range certs {
		fingerprints = append(fingerprints, authority.Fingerprint(c))
	}
	require.Contains(t, fingerprints, succ.Fingerprint, "the file holds the successor")
	require.Equal(t, succ.Serial, ss.Status().Signing.Serial)
	require.Zero(t, ss.Status().UnsafeRotations)
}
