package dynamiccert

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nobody is the unprivileged uid the permission test reads as.
const nobody = 65534

// loadAsNobody runs load on a dedicated OS thread whose filesystem uid is
// nobody, so the kernel applies file permissions even when the test runs as
// root (root's CAP_DAC_OVERRIDE is dropped from a thread whose fsuid is not
// 0). The thread is never unlocked, so it exits with the goroutine and its
// identity cannot leak into the rest of the process. ran is false if the
// fsuid could not be changed.
func loadAsNobody(load func() error) (ran bool, err error) {
	type result struct {
		err error
		ok  bool
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately no UnlockOSThread: the thread dies with us.
		if os.Geteuid() == 0 {
			_, _, _ = syscall.RawSyscall(syscall.SYS_SETFSUID, nobody, 0, 0)
			// setfsuid returns the previous fsuid: calling it again tells
			// whether the first call took effect.
			prev, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, nobody, 0, 0)
			if prev != nobody {
				ch <- result{ok: false}
				return
			}
		}
		ch <- result{err: load(), ok: true}
	}()
	r := <-ch
	return r.ok, r.err
}

// TestFileCertKeyPermissionDenied makes the key unreadable (mode 0000) and
// loads as an unprivileged filesystem user: a real EACCES from the kernel,
// also when the suite runs as root.
func TestFileCertKeyPermissionDenied(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The directories t.TempDir makes are 0700; let nobody traverse them so
	// that it is the key file's own mode that denies the read.
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	certPath, keyPath := plainPaths(dir)
	good := fileLeaf(t)
	writeAtomic(t, certPath, good.CertPEM)
	writeAtomic(t, keyPath, good.KeyPEM)
	p := newTestFileCertKey(t, certPath, keyPath)

	ran, err := loadAsNobody(p.load)
	if !ran {
		t.Skip("cannot change the filesystem uid in this environment")
	}
	require.NoError(t, err, "readable files load as nobody")
	assertServes(t, p, good)

	next := fileLeaf(t)
	writeAtomic(t, certPath, next.CertPEM)
	writeAtomic(t, keyPath, next.KeyPEM)
	require.NoError(t, os.Chmod(keyPath, 0))
	before := loadErrorCount(t, p.Name())
	_, err = loadAsNobody(p.load)
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrPermission)
	assert.Contains(t, err.Error(), keyPath)
	assert.Equal(t, before+1, loadErrorCount(t, p.Name()))
	assertServes(t, p, good)

	require.NoError(t, os.Chmod(keyPath, 0o644))
	_, err = loadAsNobody(p.load)
	require.NoError(t, err)
	assertServes(t, p, next)
}

// TestFileCertKeyFIFODoesNotBlock: a FIFO (with no writer) where a file
// should be is refused at once instead of hanging the loader in open(2).
func TestFileCertKeyFIFODoesNotBlock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certPath, keyPath := plainPaths(dir)
	good := fileLeaf(t)
	writeAtomic(t, certPath, good.CertPEM)
	writeAtomic(t, keyPath, good.KeyPEM)
	p := newTestFileCertKey(t, certPath, keyPath)
	require.NoError(t, p.RunOnce(context.Background()))

	require.NoError(t, os.Remove(keyPath))
	require.NoError(t, syscall.Mkfifo(keyPath, 0o644))
	errc := make(chan error, 1)
	go func() { errc <- p.RunOnce(context.Background()) }()
	select {
	case err := <-errc:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not a regular file")
		assert.Contains(t, err.Error(), keyPath)
	case <-time.After(fileWait):
		// Unblock the reader so the test binary can exit.
		if f, err := os.OpenFile(keyPath, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = f.Close()
		}
		t.Fatal("loading a FIFO blocked")
	}
	assertServes(t, p, good)
}
