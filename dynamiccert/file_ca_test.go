package dynamiccert

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

func newTestCA(t testing.TB, cn string, now time.Time, lifetime time.Duration) *pki.Issued {
	t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: cn, Now: now, Lifetime: lifetime})
	require.NoError(t, err)
	return ca
}

// verifiesClientOf reports whether p's VerifyOptions accept a client
// certificate issued by ca.
func verifiesClientOf(t testing.TB, p *FileCA, ca *pki.Issued) bool {
	t.Helper()
	client, err := pki.IssueLeaf(ca, pki.Request{CommonName: "client", Now: time.Now(), Lifetime: time.Hour})
	require.NoError(t, err)
	opts, ok := p.VerifyOptions()
	require.True(t, ok)
	_, err = client.Cert.Verify(opts)
	return err == nil
}

func TestNewFileCAConfig(t *testing.T) {
	_, err := NewFileCA(FileCAConfig{})
	require.Error(t, err)
	_, err = NewFileCA(FileCAConfig{File: "ca.crt", ResyncInterval: -1})
	require.Error(t, err)
	p, err := NewFileCA(FileCAConfig{File: "no/such/ca.crt"})
	require.NoError(t, err)
	assert.Equal(t, "file:no/such/ca.crt", p.Name())
	assert.Nil(t, p.CurrentCABundleContent())
	_, ok := p.VerifyOptions()
	assert.False(t, ok)
	assert.Nil(t, p.Certificates())

	err = p.RunOnce(context.Background())
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), "no/such/ca.crt")
}

func TestFileCAReloadsOnChange(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "ca.crt")
	ca1 := newTestCA(t, "ca-1", time.Now(), 24*time.Hour)
	ca2 := newTestCA(t, "ca-2", time.Now(), 24*time.Hour)
	// An expired CA in a bundle is normal during a rotation: accepted.
	expired := newTestCA(t, "ca-old", time.Now().Add(-48*time.Hour), 24*time.Hour)

	writeAtomic(t, path, ca1.CertPEM)
	p, err := NewFileCA(FileCAConfig{Name: "test:" + t.Name(), File: path})
	require.NoError(t, err)
	l := &countingListener{}
	p.AddListener(l)
	require.NoError(t, p.RunOnce(context.Background()))
	assert.Equal(t, ca1.CertPEM, p.CurrentCABundleContent())
	opts, ok := p.VerifyOptions()
	require.True(t, ok)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, opts.KeyUsages)
	assert.True(t, verifiesClientOf(t, p, ca1))
	assert.False(t, verifiesClientOf(t, p, ca2))
	assert.Equal(t, int64(1), l.n.Load())

	startRun(t, p.src, p.Run)

	// kubelet-style and rename-over updates.
	both := bytes.Join([][]byte{expired.CertPEM, ca1.CertPEM, ca2.CertPEM}, nil)
	writeAtomic(t, path, both)
	require.Eventually(t, func() bool { return bytes.Equal(p.CurrentCABundleContent(), both) }, fileWait, fileTick)
	assert.Len(t, p.Certificates(), 3)
	assert.True(t, verifiesClientOf(t, p, ca1))
	assert.True(t, verifiesClientOf(t, p, ca2))
	waitNotified(t, l, 1)

	// In-place rewrite.
	require.NoError(t, os.WriteFile(path, ca2.CertPEM, 0o644))
	require.Eventually(t, func() bool { return bytes.Equal(p.CurrentCABundleContent(), ca2.CertPEM) }, fileWait, fileTick)
	assert.False(t, verifiesClientOf(t, p, ca1))
	assert.True(t, verifiesClientOf(t, p, ca2))
	assert.NoError(t, p.LastError())
}

func TestFileCABadInputs(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		apply func(t *testing.T, path string)
		is    func(error) bool
	}{
		{"malformed PEM", func(t *testing.T, path string) { writeAtomic(t, path, []byte("nope\n")) }, wantIs(pki.ErrMalformedPEM)},
		{"trailing garbage", func(t *testing.T, path string) {
			writeAtomic(t, path, append(bytes.Clone(fileCA(t).CertPEM), "trailing\n"...))
		}, wantIs(pki.ErrMalformedPEM)},
		{"private key in the bundle", func(t *testing.T, path string) {
			writeAtomic(t, path, append(bytes.Clone(fileCA(t).CertPEM), fileCA(t).KeyPEM...))
		}, wantIs(pki.ErrMalformedPEM)},
		{"empty file", func(t *testing.T, path string) { writeAtomic(t, path, nil) }, wantIs(pki.ErrEmpty)},
		{"file over 1 MiB", func(t *testing.T, path string) {
			writeAtomic(t, path, bytes.Repeat(fileCA(t).CertPEM, pki.MaxPEMSize/len(fileCA(t).CertPEM)+1))
		}, wantIs(pki.ErrTooLarge)},
		{"symlink loop", func(t *testing.T, path string) {
			require.NoError(t, os.Symlink(filepath.Base(path)+".loop", path+".tmp"))
			require.NoError(t, os.Symlink(filepath.Base(path), path+".loop"))
			require.NoError(t, os.Rename(path+".tmp", path))
		}, wantIs(syscall.ELOOP)},
		{"file deleted", func(t *testing.T, path string) { require.NoError(t, os.Remove(path)) }, wantIs(fs.ErrNotExist)},
	}
	for _, mode := range []string{"RunOnce", "Run"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					path := filepath.Join(t.TempDir(), "ca.crt")
					good := newTestCA(t, "good", time.Now(), time.Hour)
					writeAtomic(t, path, good.CertPEM)
					p, err := NewFileCA(FileCAConfig{Name: "test:" + t.Name(), File: path, Clock: clocktesting.NewFakeClock(time.Now())})
					require.NoError(t, err)
					l := &countingListener{}
					p.AddListener(l)
					require.NoError(t, p.RunOnce(context.Background()))
					if mode == "Run" {
						startRun(t, p.src, p.Run)
					}
					before := loadErrorCount(t, p.Name())

					tc.apply(t, path)
					if mode == "RunOnce" {
						err = p.RunOnce(context.Background())
						assert.Equal(t, before+1, loadErrorCount(t, p.Name()))
					} else {
						require.Eventually(t, func() bool {
							err = p.LastError()
							return tc.is(err)
						}, fileWait, fileTick, "last error: %v", p.LastError())
						assert.Greater(t, loadErrorCount(t, p.Name()), before)
					}
					require.Error(t, err)
					assert.True(t, tc.is(err), "unexpected error %v", err)
					assert.Contains(t, err.Error(), path)
					assert.Equal(t, good.CertPEM, p.CurrentCABundleContent(), "last good bundle kept")
					assert.True(t, verifiesClientOf(t, p, good))
					assert.Equal(t, int64(1), l.n.Load())

					fixed := newTestCA(t, "fixed", time.Now(), time.Hour)
					replaceWith(t, path, fixed.CertPEM)
					if mode == "RunOnce" {
						require.NoError(t, p.RunOnce(context.Background()))
					} else {
						require.Eventually(t, func() bool { return bytes.Equal(p.CurrentCABundleContent(), fixed.CertPEM) }, fileWait, fileTick)
					}
					assert.True(t, verifiesClientOf(t, p, fixed))
					assert.NoError(t, p.LastError())
					waitNotified(t, l, 1)
				})
			}
		})
	}
}

func TestFileCAResyncWithoutEvents(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ca.crt")
	ca1 := newTestCA(t, "ca-1", time.Now(), time.Hour)
	ca2 := newTestCA(t, "ca-2", time.Now(), time.Hour)
	writeAtomic(t, path, ca1.CertPEM)
	fake := clocktesting.NewFakeClock(time.Now())
	p, err := NewFileCA(FileCAConfig{Name: "test:" + t.Name(), File: path, Clock: fake, ResyncInterval: 10 * time.Second})
	require.NoError(t, err)
	p.src.noWatch = true
	startRun(t, p.src, p.Run)
	require.Eventually(t, fake.HasWaiters, fileWait, fileTick)
	assert.Equal(t, ca1.CertPEM, p.CurrentCABundleContent())

	writeAtomic(t, path, ca2.CertPEM)
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, ca1.CertPEM, p.CurrentCABundleContent())
	fake.Step(10 * time.Second)
	require.Eventually(t, func() bool { return bytes.Equal(p.CurrentCABundleContent(), ca2.CertPEM) }, fileWait, fileTick)
	assert.False(t, errors.Is(p.LastError(), fs.ErrNotExist))
}
