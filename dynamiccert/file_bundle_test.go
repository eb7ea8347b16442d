package dynamiccert

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// credentialBundle is what the kubelet writes at a podCertificate
// projection's credentialBundlePath: the PKCS#8 private key, then the chain.
func credentialBundle(leaf *tlstest.Leaf) []byte {
	return bytes.Join([][]byte{leaf.KeyPEM, leaf.CertPEM}, nil)
}

// kubeletWriteFile is kubeletWrite for a projected volume holding one file
// (tlstest.KubeletWriteFile).
func kubeletWriteFile(t *testing.T, root, name string, data []byte) {
	t.Helper()
	tlstest.KubeletWriteFile(t, root, name, data)
}

func newChain(t *testing.T) *tlstest.Chain {
	t.Helper()
	chain, err := tlstest.NewChain(time.Now(), "bundle")
	require.NoError(t, err)
	return chain
}

func chainLeaf(t *testing.T, chain *tlstest.Chain) *tlstest.Leaf {
	t.Helper()
	leaf, err := chain.Issue(time.Now(), time.Hour, "file.example.com")
	require.NoError(t, err)
	return leaf
}

// waitServesLeaf waits until p serves leaf, then checks that every
// accessor returns the key and the whole chain apart.
func waitServesLeaf(t *testing.T, p *FileCertKey, leaf *tlstest.Leaf) {
	t.Helper()
	require.Eventually(t, func() bool {
		s := servedSerial(p)
		return s != nil && s.Cmp(leaf.Cert.SerialNumber) == 0
	}, fileWait, fileTick, "certificate with serial %x never served", leaf.Cert.SerialNumber)
	cert, key := p.CurrentCertKeyContent()
	assert.Equal(t, string(leaf.CertPEM), string(cert), "the chain, without the key")
	assert.Equal(t, string(leaf.KeyPEM), string(key), "the key, without the chain")
	assert.Len(t, p.current().TLS.Certificate, 2, "leaf and intermediate")
}

// TestFileCertKeyOneFile reads a podCertificate credential bundle (key and
// chain in one file) through the real watch loop while the kubelet's
// atomic writer replaces it: a new bundle is served; a bundle whose chain is
// out of order is refused with an error naming the file, counted, and the
// last good one keeps being served, over real handshakes to a client that
// trusts only the root.
func TestFileCertKeyOneFile(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	path := filepath.Join(root, "credentialbundle.pem")
	chain := newChain(t)
	first := chainLeaf(t, chain)
	kubeletWriteFile(t, root, "credentialbundle.pem", credentialBundle(first))

	p := newTestFileCertKey(t, path, path)
	l := &countingListener{}
	p.AddListener(l)
	require.NoError(t, p.RunOnce(context.Background()))
	waitServesLeaf(t, p, first)
	startRun(t, p.src, p.Run)
	addr := servingServer(t, p)
	verify := func(want *tlstest.Leaf) {
		t.Helper()
		st, err := tlstest.HandshakeState(addr, &tls.Config{RootCAs: chain.RootPool(), ServerName: "file.example.com"})
		require.NoError(t, err, "a client trusting only the root verifies the served chain")
		require.Len(t, st.PeerCertificates, 2)
		assert.Equal(t, 0, st.PeerCertificates[0].SerialNumber.Cmp(want.Cert.SerialNumber))
		assert.Equal(t, chain.Intermediate.Raw, st.PeerCertificates[1].Raw, "the intermediate is sent")
		require.Len(t, st.VerifiedChains, 1)
		assert.Equal(t, chain.Root.Raw, st.VerifiedChains[0][2].Raw)
	}
	verify(first)

	notified := l.n.Load()
	second := chainLeaf(t, chain)
	kubeletWriteFile(t, root, "credentialbundle.pem", credentialBundle(second))
	waitServesLeaf(t, p, second)
	waitNotified(t, l, notified)
	verify(second)

	// The root where the intermediate belongs: refused, counted, named.
	errorsBefore := loadErrorCount(t, p.Name())
	notified = l.n.Load()
	third := chainLeaf(t, chain)
	broken := bytes.Join([][]byte{third.KeyPEM, third.CertPEM[:bytes.Index(third.CertPEM, chain.IntermediatePEM)], chain.RootPEM}, nil)
	kubeletWriteFile(t, root, "credentialbundle.pem", broken)
	require.Eventually(t, func() bool { return errors.Is(p.LastError(), pki.ErrBrokenChain) }, fileWait, fileTick)
	assert.ErrorContains(t, p.LastError(), "loading certificate and key from "+path)
	assert.ErrorContains(t, p.LastError(), `issued by "bundle-intermediate", but certificate 2 is "bundle-root"`)
	assert.Greater(t, loadErrorCount(t, p.Name()), errorsBefore)
	assert.Equal(t, notified, l.n.Load(), "no notification for rejected content")
	verify(second)

	kubeletWriteFile(t, root, "credentialbundle.pem", credentialBundle(third))
	waitServesLeaf(t, p, third)
	assert.NoError(t, p.LastError())
	verify(third)
}

// TestFileCertKeyOneFileLayouts loads the layouts one file may have: the
// key first (podCertificate) or last (cat tls.crt tls.key); and refuses a
// file without a key, with two, or with the wrong one. The key encodings
// (PKCS#8, PKCS#1, SEC 1) are pki.SplitCertKey's tests.
func TestFileCertKeyOneFileLayouts(t *testing.T) {
	t.Parallel()
	chain := newChain(t)
	leaf := chainLeaf(t, chain)
	other := chainLeaf(t, chain)
	for _, tc := range []struct {
		name    string
		data    []byte
		serial  *tlstest.Leaf
		wantErr error
	}{
		{name: "key then chain", data: credentialBundle(leaf), serial: leaf},
		{name: "chain then key", data: bytes.Join([][]byte{leaf.CertPEM, leaf.KeyPEM}, nil), serial: leaf},
		{name: "no key", data: leaf.CertPEM, wantErr: pki.ErrMalformedPEM},
		{name: "two keys", data: bytes.Join([][]byte{leaf.KeyPEM, leaf.CertPEM, other.KeyPEM}, nil), wantErr: pki.ErrMalformedPEM},
		{name: "key of another leaf", data: bytes.Join([][]byte{other.KeyPEM, leaf.CertPEM}, nil), wantErr: pki.ErrKeyMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tls.pem")
			require.NoError(t, os.WriteFile(path, tc.data, 0o600))
			p := newTestFileCertKey(t, path, path)
			err := p.RunOnce(context.Background())
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				assert.ErrorContains(t, err, path)
				assert.Nil(t, p.current())
				return
			}
			require.NoError(t, err)
			waitServesLeaf(t, p, tc.serial)
		})
	}
}
