package dynamiccert

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
)

// TestFileCertKeyOneFileDistinctSplitFailures: two different bad one-file
// bundles that fail to split with the same message (two private keys) are
// two load failures, as two different bad pairs of files are; the same bad
// bundle re-read at every resync stays one. Before the fix a split failure
// was not marked with its content, so the second bad bundle was taken for
// a retry of the first and never counted, logged or sent as an Event.
func TestFileCertKeyOneFileDistinctSplitFailures(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	path := filepath.Join(root, "credentialbundle.pem")
	chain := newChain(t)
	good := chainLeaf(t, chain)
	kubeletWriteFile(t, root, "credentialbundle.pem", credentialBundle(good))

	p := newTestFileCertKey(t, path, path)
	require.NoError(t, p.RunOnce(context.Background()))
	waitServesLeaf(t, p, good)
	startRun(t, p.src, p.Run)

	twoKeys := func() []byte {
		a, b := chainLeaf(t, chain), chainLeaf(t, chain)
		return bytes.Join([][]byte{a.KeyPEM, b.KeyPEM, a.CertPEM}, nil)
	}
	before := loadErrorCount(t, p.Name())
	kubeletWriteFile(t, root, "credentialbundle.pem", twoKeys())
	require.Eventually(t, func() bool { return loadErrorCount(t, p.Name()) == before+1 }, fileWait, fileTick)
	require.ErrorIs(t, p.LastError(), pki.ErrMalformedPEM)
	first := p.LastError().Error()

	// The same bad bundle, re-read: still one failure.
	require.ErrorIs(t, p.RunOnce(context.Background()), pki.ErrMalformedPEM)
	assert.Equal(t, before+1, loadErrorCount(t, p.Name()), "a retry of the same bad bundle is not another failure")

	// Another bad bundle, same message: a second failure.
	kubeletWriteFile(t, root, "credentialbundle.pem", twoKeys())
	require.Eventually(t, func() bool { return loadErrorCount(t, p.Name()) == before+2 }, fileWait, fileTick,
		"a different bad bundle is a distinct failure")
	assert.Equal(t, first, p.LastError().Error(), "same message, different content")
	waitServesLeaf(t, p, good)
}
