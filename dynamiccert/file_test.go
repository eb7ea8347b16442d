package dynamiccert

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/certreport/certreporttest"
	"github.com/evercert/evercert/internal/pki"
)

const (
	fileWait = 5 * time.Second
	fileTick = 10 * time.Millisecond
)

var (
	fileTestCAOnce sync.Once
	fileTestCA     *pki.Issued
	fileTestCAErr  error
)

// fileCA returns a CA valid from a day ago for a year, so leaves can be
// issued in the past and in the future.
func fileCA(t testing.TB) *pki.Issued {
	t.Helper()
	fileTestCAOnce.Do(func() {
		fileTestCA, fileTestCAErr = pki.NewCA(pki.Request{CommonName: "file-test-ca", Now: time.Now().Add(-24 * time.Hour), Lifetime: 365 * 24 * time.Hour})
	})
	require.NoError(t, fileTestCAErr)
	return fileTestCA
}

func fileLeafAt(t testing.TB, now time.Time, lifetime time.Duration) *pki.Issued {
	t.Helper()
	leaf, err := pki.IssueLeaf(fileCA(t), pki.Request{CommonName: "file.example.com", DNSNames: []string{"file.example.com"}, Now: now, Lifetime: lifetime})
	require.NoError(t, err)
	return leaf
}

func fileLeaf(t testing.TB) *pki.Issued { return fileLeafAt(t, time.Now(), time.Hour) }

// writeAtomic writes data to a temporary file in the same directory and
// renames it over path, so a reader never sees a partial file.
func writeAtomic(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".tmp-%s-%d", filepath.Base(path), time.Now().UnixNano()))
	require.NoError(t, os.WriteFile(tmp, data, 0o644))
	require.NoError(t, os.Rename(tmp, path))
}

// replaceWith removes whatever is at path (file, dir, symlink, FIFO) and
// writes data there.
func replaceWith(t testing.TB, path string, data []byte) {
	t.Helper()
	require.NoError(t, os.RemoveAll(path))
	require.NoError(t, os.WriteFile(path, data, 0o644))
}

type countingListener struct{ n atomic.Int64 }

func (c *countingListener) Enqueue() { c.n.Add(1) }

// waitNotified waits until l has been notified more than after times.
// Providers notify right after swapping content in, so a test that saw the
// new content may briefly see the old count.
func waitNotified(t testing.TB, l *countingListener, after int64) {
	t.Helper()
	require.Eventually(t, func() bool { return l.n.Load() > after }, fileWait, fileTick, "listeners not notified")
}

func loadErrorCount(t testing.TB, provider string) float64 {
	t.Helper()
	values, err := testutil.GetCounterValuesFromGatherer(legacyregistry.DefaultGatherer,
		"evercert_certificate_load_errors_total", map[string]string{"provider": provider}, "provider")
	if err != nil {
		// Not registered or no series yet.
		return 0
	}
	return values[provider]
}

func servedSerial(p *FileCertKey) *big.Int {
	if kp := p.current(); kp != nil {
		return kp.Leaf.SerialNumber
	}
	return nil
}

// assertServes checks that every accessor agrees on leaf being served.
func assertServes(t testing.TB, p *FileCertKey, leaf *pki.Issued) {
	t.Helper()
	kp := p.current()
	require.NotNil(t, kp)
	assert.Equal(t, 0, kp.Leaf.SerialNumber.Cmp(leaf.Cert.SerialNumber), "served serial")
	cert, key := p.CurrentCertKeyContent()
	assert.Equal(t, leaf.CertPEM, cert)
	assert.Equal(t, leaf.KeyPEM, key)
}

func waitServes(t testing.TB, p *FileCertKey, leaf *pki.Issued) {
	t.Helper()
	require.Eventually(t, func() bool {
		s := servedSerial(p)
		return s != nil && s.Cmp(leaf.Cert.SerialNumber) == 0
	}, fileWait, fileTick, "certificate with serial %x never served", leaf.Cert.SerialNumber)
	assertServes(t, p, leaf)
}

// startRun runs p.Run until the test ends and waits for the loop's first
// reload, so that later changes are seen through events, not the start-up
// read. The cleanup checks that Run returns once its context is done.
func startRun(t testing.TB, src *fileSource, run func(context.Context, int)) {
	t.Helper()
	startRunCounting(t, src, run)
}

// startRunCounting is startRun, and returns the number of reloads the loop
// has done so far.
func startRunCounting(t testing.TB, src *fileSource, run func(context.Context, int)) *atomic.Int64 {
	t.Helper()
	started := make(chan struct{})
	var once sync.Once
	syncs := &atomic.Int64{}
	src.afterSync = func() {
		syncs.Add(1)
		once.Do(func() { close(started) })
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, 1)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(fileWait):
			t.Errorf("Run did not return within %v of cancellation", fileWait)
		}
	})
	select {
	case <-started:
	case <-time.After(fileWait):
		t.Fatalf("Run did not start within %v", fileWait)
	}
	return syncs
}

func newTestFileCertKey(t testing.TB, certPath, keyPath string, mutate ...func(*FileCertKeyConfig)) *FileCertKey {
	t.Helper()
	cfg := FileCertKeyConfig{Name: "test:" + t.Name(), CertFile: certPath, KeyFile: keyPath}
	for _, m := range mutate {
		m(&cfg)
	}
	p, err := NewFileCertKey(cfg)
	require.NoError(t, err)
	return p
}

func TestNewFileCertKeyConfig(t *testing.T) {
	_, err := NewFileCertKey(FileCertKeyConfig{KeyFile: "k"})
	require.Error(t, err)
	_, err = NewFileCertKey(FileCertKeyConfig{CertFile: "c"})
	require.Error(t, err)
	// One file for both (see TestFileCertKeyOneFile), however spelled.
	p, err := NewFileCertKey(FileCertKeyConfig{CertFile: "same.pem", KeyFile: "./same.pem"})
	require.NoError(t, err)
	assert.True(t, p.oneFile)
	assert.Len(t, p.src.paths, 1)
	_, err = NewFileCertKey(FileCertKeyConfig{CertFile: "c", KeyFile: "k", ResyncInterval: -time.Second})
	require.Error(t, err)

	names := []string{"a.example.com"}
	p, err = NewFileCertKey(FileCertKeyConfig{CertFile: "does/not/exist.crt", KeyFile: "does/not/exist.key", SNINames: names})
	require.NoError(t, err, "files need not exist at construction")
	names[0] = "mutated"
	assert.Equal(t, "file:does/not/exist.crt", p.Name())
	assert.Equal(t, []string{"a.example.com"}, p.SNINames())
	assert.Equal(t, DefaultFileResyncInterval, p.src.resync)
	assert.True(t, filepath.IsAbs(p.src.paths[0]))
	assert.False(t, p.oneFile)
	assert.Nil(t, p.current())
	c, k := p.CurrentCertKeyContent()
	assert.Nil(t, c)
	assert.Nil(t, k)
	assert.NoError(t, p.LastError())

	p, err = NewFileCertKey(FileCertKeyConfig{Name: "n", CertFile: "c", KeyFile: "k"})
	require.NoError(t, err)
	assert.Equal(t, "n", p.Name())
	assert.Nil(t, p.SNINames())
}

func TestFileCertKeyRunOnceWithoutFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	p := newTestFileCertKey(t, certPath, keyPath)
	before := loadErrorCount(t, p.Name())
	err := p.RunOnce(context.Background())
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), certPath)
	assert.Equal(t, err, p.LastError())
	assert.Equal(t, before+1, loadErrorCount(t, p.Name()))
	assert.Nil(t, p.current())

	// Still usable: the files appear and the next load takes them.
	leaf := fileLeaf(t)
	writeAtomic(t, certPath, leaf.CertPEM)
	writeAtomic(t, keyPath, leaf.KeyPEM)
	l := &countingListener{}
	p.AddListener(l)
	require.NoError(t, p.RunOnce(context.Background()))
	assertServes(t, p, leaf)
	assert.NoError(t, p.LastError())
	assert.Equal(t, int64(1), l.n.Load())

	// Unchanged content: no notification.
	require.NoError(t, p.RunOnce(context.Background()))
	assert.Equal(t, int64(1), l.n.Load())
}

// fsPattern is one way the files can be laid out and updated on disk.
type fsPattern struct {
	name string
	// paths returns the configured cert and key paths under root.
	paths func(root string) (string, string)
	// write puts leaf on disk the way the pattern does.
	write func(t *testing.T, root string, leaf *pki.Issued)
	// missingAtStart: the directory does not exist when Run starts.
	missingAtStart bool
	// beforeUpdate runs before the second write.
	beforeUpdate func(t *testing.T, root string)
}

func plainPaths(root string) (string, string) {
	return filepath.Join(root, "tls.crt"), filepath.Join(root, "tls.key")
}

// kubeletWrite mimics the kubelet's AtomicWriter: the payload goes into a
// new timestamped directory, a ..data_tmp symlink to it is renamed over
// ..data, the user-visible names are symlinks through ..data, and the old
// timestamped directory is removed.
func kubeletWrite(t *testing.T, root string, leaf *pki.Issued) {
	require.NoError(t, os.MkdirAll(root, 0o755))
	ts := "..2026_" + time.Now().UTC().Format("01_02_15_04_05.000000000")
	tsDir := filepath.Join(root, ts)
	require.NoError(t, os.Mkdir(tsDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(tsDir, "tls.crt"), leaf.CertPEM, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(tsDir, "tls.key"), leaf.KeyPEM, 0o644))
	old, _ := os.Readlink(filepath.Join(root, "..data"))
	require.NoError(t, os.Symlink(ts, filepath.Join(root, "..data_tmp")))
	require.NoError(t, os.Rename(filepath.Join(root, "..data_tmp"), filepath.Join(root, "..data")))
	for _, name := range []string{"tls.crt", "tls.key"} {
		link := filepath.Join(root, name)
		if _, err := os.Lstat(link); errors.Is(err, fs.ErrNotExist) {
			require.NoError(t, os.Symlink(filepath.Join("..data", name), link))
		}
	}
	if old != "" {
		require.NoError(t, os.RemoveAll(filepath.Join(root, old)))
	}
}

var fsPatterns = []fsPattern{
	{
		name:  "in-place rewrite",
		paths: plainPaths,
		write: func(t *testing.T, root string, leaf *pki.Issued) {
			c, k := plainPaths(root)
			require.NoError(t, os.WriteFile(c, leaf.CertPEM, 0o644))
			require.NoError(t, os.WriteFile(k, leaf.KeyPEM, 0o644))
		},
	},
	{
		name:  "kubelet atomic writer",
		paths: plainPaths,
		write: kubeletWrite,
	},
	{
		name:  "delete then create",
		paths: plainPaths,
		write: func(t *testing.T, root string, leaf *pki.Issued) {
			c, k := plainPaths(root)
			require.NoError(t, os.RemoveAll(c))
			require.NoError(t, os.RemoveAll(k))
			require.NoError(t, os.WriteFile(c, leaf.CertPEM, 0o644))
			require.NoError(t, os.WriteFile(k, leaf.KeyPEM, 0o644))
		},
	},
	{
		name:  "rename over",
		paths: plainPaths,
		write: func(t *testing.T, root string, leaf *pki.Issued) {
			c, k := plainPaths(root)
			writeAtomic(t, c, leaf.CertPEM)
			writeAtomic(t, k, leaf.KeyPEM)
		},
	},
	{
		name: "directory missing at start",
		paths: func(root string) (string, string) {
			return plainPaths(filepath.Join(root, "not", "yet"))
		},
		write: func(t *testing.T, root string, leaf *pki.Issued) {
			dir := filepath.Join(root, "not", "yet")
			require.NoError(t, os.MkdirAll(dir, 0o755))
			c, k := plainPaths(dir)
			require.NoError(t, os.WriteFile(c, leaf.CertPEM, 0o644))
			require.NoError(t, os.WriteFile(k, leaf.KeyPEM, 0o644))
		},
		missingAtStart: true,
	},
	{
		name:  "directory deleted and recreated",
		paths: func(root string) (string, string) { return plainPaths(filepath.Join(root, "certs")) },
		write: func(t *testing.T, root string, leaf *pki.Issued) {
			dir := filepath.Join(root, "certs")
			require.NoError(t, os.MkdirAll(dir, 0o755))
			c, k := plainPaths(dir)
			require.NoError(t, os.WriteFile(c, leaf.CertPEM, 0o644))
			require.NoError(t, os.WriteFile(k, leaf.KeyPEM, 0o644))
		},
		beforeUpdate: func(t *testing.T, root string) {
			require.NoError(t, os.RemoveAll(filepath.Join(root, "certs")))
			// Let the loop see the directory go away before it comes back.
			time.Sleep(150 * time.Millisecond)
		},
	},
	{
		name:  "symlinks into another directory, target rewritten in place",
		paths: func(root string) (string, string) { return plainPaths(filepath.Join(root, "links")) },
		write: func(t *testing.T, root string, leaf *pki.Issued) {
			links, store := filepath.Join(root, "links"), filepath.Join(root, "store")
			require.NoError(t, os.MkdirAll(links, 0o755))
			require.NoError(t, os.MkdirAll(store, 0o755))
			for name, data := range map[string][]byte{"tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM} {
				require.NoError(t, os.WriteFile(filepath.Join(store, name), data, 0o644))
				link := filepath.Join(links, name)
				if _, err := os.Lstat(link); errors.Is(err, fs.ErrNotExist) {
					require.NoError(t, os.Symlink(filepath.Join(store, name), link))
				}
			}
		},
	},
}

func TestFileCertKeyFilesystemPatterns(t *testing.T) {
	t.Parallel()
	for _, pat := range fsPatterns {
		t.Run(pat.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			certPath, keyPath := pat.paths(root)
			p := newTestFileCertKey(t, certPath, keyPath)
			l := &countingListener{}
			p.AddListener(l)

			first := fileLeaf(t)
			if pat.missingAtStart {
				err := p.RunOnce(context.Background())
				require.Error(t, err)
				assert.Contains(t, err.Error(), certPath)
			} else {
				pat.write(t, root, first)
				require.NoError(t, p.RunOnce(context.Background()))
				assertServes(t, p, first)
			}
			startRun(t, p.src, p.Run)
			notified := l.n.Load()

			if pat.missingAtStart {
				pat.write(t, root, first)
				waitServes(t, p, first)
				waitNotified(t, l, notified)
				notified = l.n.Load()
			}
			if pat.beforeUpdate != nil {
				pat.beforeUpdate(t, root)
			}
			second := fileLeaf(t)
			start := time.Now()
			pat.write(t, root, second)
			waitServes(t, p, second)
			t.Logf("served %v after the write", time.Since(start))
			waitNotified(t, l, notified)
			assert.NoError(t, p.LastError())

			// And once more, to show the watch survived the first change.
			third := fileLeaf(t)
			pat.write(t, root, third)
			waitServes(t, p, third)
		})
	}
}

func TestFileCertKeyHalfWrittenPair(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certPath, keyPath := plainPaths(dir)
	old := fileLeaf(t)
	writeAtomic(t, certPath, old.CertPEM)
	writeAtomic(t, keyPath, old.KeyPEM)
	p := newTestFileCertKey(t, certPath, keyPath)
	l := &countingListener{}
	p.AddListener(l)
	require.NoError(t, p.RunOnce(context.Background()))
	startRun(t, p.src, p.Run)
	notified := l.n.Load()

	next := fileLeaf(t)
	writeAtomic(t, certPath, next.CertPEM)
	require.Eventually(t, func() bool { return errors.Is(p.LastError(), pki.ErrKeyMismatch) }, fileWait, fileTick)
	assert.GreaterOrEqual(t, loadErrorCount(t, p.Name()), float64(1))
	assertServes(t, p, old)
	assert.Equal(t, notified, l.n.Load(), "no notification for rejected content")

	writeAtomic(t, keyPath, next.KeyPEM)
	waitServes(t, p, next)
	assert.NoError(t, p.LastError())
	waitNotified(t, l, notified)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, notified+1, l.n.Load(), "notified once")
}

// clientOnlyLeaf is a certificate whose extended key usage allows client
// auth only.
func clientOnlyLeaf(t testing.TB, now time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	ca := fileCA(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := pki.NewSerial()
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "client-only"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	require.NoError(t, err)
	keyPEM, err = pki.EncodeKeyPEM(key)
	require.NoError(t, err)
	return pki.EncodeCertPEM(der), keyPEM
}

var (
	rsaKeyOnce sync.Once
	rsaKeyPEM  []byte
)

func rsaKey(t testing.TB) []byte {
	t.Helper()
	rsaKeyOnce.Do(func() {
		k, err := pki.GenerateKey(pki.RSA2048)
		if err == nil {
			rsaKeyPEM, _ = pki.EncodeKeyPEM(k)
		}
	})
	require.NotEmpty(t, rsaKeyPEM)
	return rsaKeyPEM
}

// badInput is one way to break the files.
type badInput struct {
	name  string
	apply func(t *testing.T, certPath, keyPath string, now time.Time)
	// is reports whether err is the expected one.
	is func(err error) bool
}

func wantIs(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

func badInputs() []badInput {
	return []badInput{
		{"malformed PEM", func(t *testing.T, c, _ string, _ time.Time) {
			writeAtomic(t, c, []byte("this is not PEM\n"))
		}, wantIs(pki.ErrMalformedPEM)},
		{"trailing garbage", func(t *testing.T, c, k string, now time.Time) {
			leaf := fileLeafAt(t, now, time.Hour)
			writeAtomic(t, k, leaf.KeyPEM)
			writeAtomic(t, c, append(bytes.Clone(leaf.CertPEM), "garbage after the PEM\n"...))
		}, wantIs(pki.ErrMalformedPEM)},
		{"RSA key with ECDSA certificate", func(t *testing.T, c, k string, now time.Time) {
			writeAtomic(t, k, rsaKey(t))
			writeAtomic(t, c, fileLeafAt(t, now, time.Hour).CertPEM)
		}, wantIs(pki.ErrKeyMismatch)},
		{"encrypted key", func(t *testing.T, _, k string, _ time.Time) {
			writeAtomic(t, k, pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte("opaque")}))
		}, wantIs(pki.ErrEncryptedKey)},
		{"legacy encrypted key", func(t *testing.T, _, k string, _ time.Time) {
			writeAtomic(t, k, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY",
				Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-256-CBC,00000000000000000000000000000000"},
				Bytes:   []byte("opaque")}))
		}, wantIs(pki.ErrEncryptedKey)},
		{"key does not match (half-written pair)", func(t *testing.T, c, _ string, now time.Time) {
			writeAtomic(t, c, fileLeafAt(t, now, time.Hour).CertPEM)
		}, wantIs(pki.ErrKeyMismatch)},
		{"expired on the injected clock (valid on the wall clock)", func(t *testing.T, c, k string, _ time.Time) {
			leaf := fileLeafAt(t, time.Now(), time.Hour)
			writeAtomic(t, k, leaf.KeyPEM)
			writeAtomic(t, c, leaf.CertPEM)
		}, wantIs(pki.ErrExpired)},
		{"not yet valid", func(t *testing.T, c, k string, now time.Time) {
			leaf := fileLeafAt(t, now.Add(time.Hour), time.Hour)
			writeAtomic(t, k, leaf.KeyPEM)
			writeAtomic(t, c, leaf.CertPEM)
		}, wantIs(pki.ErrNotYetValid)},
		{"certificate without server auth", func(t *testing.T, c, k string, now time.Time) {
			cert, key := clientOnlyLeaf(t, now)
			writeAtomic(t, k, key)
			writeAtomic(t, c, cert)
		}, wantIs(pki.ErrNotServingCert)},
		{"empty file", func(t *testing.T, c, _ string, _ time.Time) {
			writeAtomic(t, c, nil)
		}, wantIs(pki.ErrEmpty)},
		{"file over 1 MiB (sparse 64 MiB)", func(t *testing.T, c, _ string, _ time.Time) {
			tmp := c + ".big"
			f, err := os.Create(tmp)
			require.NoError(t, err)
			require.NoError(t, f.Truncate(64<<20))
			require.NoError(t, f.Close())
			require.NoError(t, os.Rename(tmp, c))
		}, wantIs(pki.ErrTooLarge)},
		{"symlink loop", func(t *testing.T, c, _ string, _ time.Time) {
			require.NoError(t, os.Symlink(filepath.Base(c)+".loop", c+".tmp"))
			require.NoError(t, os.Symlink(filepath.Base(c), c+".loop"))
			require.NoError(t, os.Rename(c+".tmp", c))
		}, wantIs(syscall.ELOOP)},
		{"path is a directory", func(t *testing.T, _, k string, _ time.Time) {
			require.NoError(t, os.Remove(k))
			require.NoError(t, os.Mkdir(k, 0o755))
		}, func(err error) bool {
			var pe *fs.PathError
			return errors.As(err, &pe) && strings.Contains(err.Error(), "not a regular file")
		}},
		{"certificate deleted", func(t *testing.T, c, _ string, _ time.Time) {
			require.NoError(t, os.Remove(c))
		}, wantIs(fs.ErrNotExist)},
		{"key deleted", func(t *testing.T, _, k string, _ time.Time) {
			require.NoError(t, os.Remove(k))
		}, wantIs(fs.ErrNotExist)},
	}
}

// TestFileCertKeyBadInputs breaks good files in every way and checks that
// the last good pair keeps being served, that the error names the files and
// is counted, and that a good pair is taken again afterwards. Each case is
// run with explicit RunOnce calls and with the Run loop reacting to the
// change by itself.
func TestFileCertKeyBadInputs(t *testing.T) {
	t.Parallel()
	// The injected clock is ten days ahead of the wall clock, so the
	// validity checks provably use it.
	now := time.Now().Add(10 * 24 * time.Hour)
	for _, mode := range []string{"RunOnce", "Run"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			for _, bad := range badInputs() {
				t.Run(bad.name, func(t *testing.T) {
					t.Parallel()
					dir := t.TempDir()
					certPath, keyPath := plainPaths(dir)
					fake := clocktesting.NewFakeClock(now)
					p := newTestFileCertKey(t, certPath, keyPath, func(c *FileCertKeyConfig) { c.Clock = fake })
					l := &countingListener{}
					p.AddListener(l)
					good := fileLeafAt(t, now, time.Hour)
					writeAtomic(t, certPath, good.CertPEM)
					writeAtomic(t, keyPath, good.KeyPEM)
					require.NoError(t, p.RunOnce(context.Background()))
					assertServes(t, p, good)
					if mode == "Run" {
						startRun(t, p.src, p.Run)
					}
					errsBefore := loadErrorCount(t, p.Name())
					notified := l.n.Load()

					bad.apply(t, certPath, keyPath, now)
					var err error
					if mode == "RunOnce" {
						err = p.RunOnce(context.Background())
						require.Error(t, err)
						assert.Equal(t, errsBefore+1, loadErrorCount(t, p.Name()), "error counted")
					} else {
						require.Eventually(t, func() bool {
							err = p.LastError()
							return err != nil && loadErrorCount(t, p.Name()) > errsBefore
						}, fileWait, fileTick, "error never observed")
						// A non-atomic change may be seen half-way first;
						// wait for the final state's error.
						require.Eventually(t, func() bool {
							err = p.LastError()
							return bad.is(err)
						}, fileWait, fileTick, "expected error never reported, last: %v", p.LastError())
					}
					assert.True(t, bad.is(err), "unexpected error: %v", err)
					assert.Equal(t, err, p.LastError())
					assert.Contains(t, err.Error(), certPath, "error names the certificate file")
					assert.Contains(t, err.Error(), keyPath, "error names the key file")
					assertServes(t, p, good)
					assert.Equal(t, notified, l.n.Load(), "no notification for bad content")

					// Recovery.
					fixed := fileLeafAt(t, now, time.Hour)
					replaceWith(t, keyPath, fixed.KeyPEM)
					replaceWith(t, certPath, fixed.CertPEM)
					if mode == "RunOnce" {
						require.NoError(t, p.RunOnce(context.Background()))
						assertServes(t, p, fixed)
					} else {
						waitServes(t, p, fixed)
					}
					assert.NoError(t, p.LastError())
					waitNotified(t, l, notified)
				})
			}
		})
	}
}

// TestFileCertKeyResyncWithoutEvents turns the watcher off and shows that
// the resync ticker on the injected clock reloads the files by itself.
func TestFileCertKeyResyncWithoutEvents(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certPath, keyPath := plainPaths(dir)
	first := fileLeaf(t)
	writeAtomic(t, certPath, first.CertPEM)
	writeAtomic(t, keyPath, first.KeyPEM)
	fake := clocktesting.NewFakeClock(time.Now())
	p := newTestFileCertKey(t, certPath, keyPath, func(c *FileCertKeyConfig) {
		c.Clock = fake
		c.ResyncInterval = 30 * time.Second
	})
	p.src.noWatch = true
	l := &countingListener{}
	p.AddListener(l)
	startRun(t, p.src, p.Run)
	assertServes(t, p, first)
	require.Eventually(t, fake.HasWaiters, fileWait, fileTick, "resync ticker never created")

	second := fileLeaf(t)
	writeAtomic(t, certPath, second.CertPEM)
	writeAtomic(t, keyPath, second.KeyPEM)
	time.Sleep(200 * time.Millisecond)
	assertServes(t, p, first) // no watcher: nothing noticed the change yet

	fake.Step(29 * time.Second)
	time.Sleep(100 * time.Millisecond)
	assertServes(t, p, first) // not yet a full interval

	notified := l.n.Load()
	fake.Step(time.Second)
	waitServes(t, p, second)
	waitNotified(t, l, notified)
}

// TestFileCertKeyBecomesValidOnResync: a certificate that is not yet valid
// is rejected, and taken by a later resync once the (injected) clock has
// passed its NotBefore, with no change on disk.
func TestFileCertKeyBecomesValidOnResync(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certPath, keyPath := plainPaths(dir)
	now := time.Now()
	future := fileLeafAt(t, now.Add(time.Hour), time.Hour) // NotBefore = now+55m
	writeAtomic(t, certPath, future.CertPEM)
	writeAtomic(t, keyPath, future.KeyPEM)
	fake := clocktesting.NewFakeClock(now)
	p := newTestFileCertKey(t, certPath, keyPath, func(c *FileCertKeyConfig) { c.Clock = fake })
	require.ErrorIs(t, p.RunOnce(context.Background()), pki.ErrNotYetValid)
	startRun(t, p.src, p.Run)
	require.Eventually(t, fake.HasWaiters, fileWait, fileTick)
	assert.Nil(t, p.current())

	fake.Step(time.Hour)
	waitServes(t, p, future)
	assert.NoError(t, p.LastError())
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// captureKlog sends klog output to a buffer at -v=10 for the rest of the
// test. Tests that use it must not be parallel.
func captureKlog(t *testing.T) *syncBuffer {
	flags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(flags)
	saved := map[string]string{}
	set := map[string]string{"logtostderr": "false", "alsologtostderr": "false", "one_output": "true", "v": "10", "skip_headers": "true", "stderrthreshold": "FATAL"}
	for name, v := range set {
		saved[name] = flags.Lookup(name).Value.String()
		require.NoError(t, flags.Set(name, v))
	}
	buf := &syncBuffer{}
	klog.SetOutput(buf)
	t.Cleanup(func() {
		klog.Flush()
		for name, v := range saved {
			_ = flags.Set(name, v)
		}
		klog.SetOutput(os.Stderr)
	})
	return buf
}

// TestFileCertKeyReportsEachDistinctFailureOnce: a failure is counted,
// logged and sent as an Event once however often it is re-read (events,
// resyncs); a different bad content is another failure even with the same
// error message, and so is a different error, and the same content after a
// recovery. It is not parallel: it captures the global klog output.
func TestFileCertKeyReportsEachDistinctFailureOnce(t *testing.T) {
	logs := captureKlog(t)
	dir := t.TempDir()
	certPath, keyPath := plainPaths(dir)
	good := fileLeaf(t)
	writeAtomic(t, certPath, good.CertPEM)
	writeAtomic(t, keyPath, good.KeyPEM)
	fake := clocktesting.NewFakeClock(time.Now())
	recorder := certreporttest.NewRecorder()
	p := newTestFileCertKey(t, certPath, keyPath, func(c *FileCertKeyConfig) {
		c.Clock, c.EventRecorder, c.EventObject = fake, recorder, certreporttest.Pod
	})
	syncs := startRunCounting(t, p.src, p.Run)
	require.Eventually(t, fake.HasWaiters, fileWait, fileTick)
	assertServes(t, p, good)
	before := loadErrorCount(t, p.Name())

	countErrLines := func(out string) int {
		n := 0
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "Rejected new content") && strings.Contains(line, fmt.Sprintf("%q", p.Name())) {
				n++
			}
		}
		return n
	}
	// counted waits until n failures were counted in all.
	counted := func(n float64) {
		t.Helper()
		require.Eventually(t, func() bool { return loadErrorCount(t, p.Name()) == before+n }, fileWait, fileTick)
	}
	// resync steps the clock to the next resync and waits for its reload;
	// a resync reports what it reads at once.
	resync := func() {
		t.Helper()
		n := syncs.Load()
		fake.Step(DefaultFileResyncInterval)
		require.Eventually(t, func() bool { return syncs.Load() > n }, fileWait, fileTick)
	}

	// The same bad content, seen through three events and three resyncs:
	// one failure.
	garbage := []byte("not a certificate\n")
	writeAtomic(t, certPath, garbage)
	counted(1)
	for range 2 {
		writeAtomic(t, certPath, garbage)
		resync()
	}
	for range 3 {
		resync()
	}
	resync() // every earlier reload has been reported by now
	assert.Equal(t, before+1, loadErrorCount(t, p.Name()), "the same failure retried is counted once")
	klog.Flush()
	assert.Equal(t, 1, countErrLines(logs.String()), "same error logged once:\n%s", logs.String())

	// Other garbage fails with the same message, but it is new content.
	writeAtomic(t, certPath, []byte("still not a certificate\n"))
	counted(2)
	resync()
	resync()
	assert.Equal(t, before+2, loadErrorCount(t, p.Name()))

	// A different error is another failure.
	other := fileLeaf(t)
	writeAtomic(t, certPath, other.CertPEM) // with the old key: mismatch
	require.Eventually(t, func() bool { return errors.Is(p.LastError(), pki.ErrKeyMismatch) }, fileWait, fileTick)
	counted(3)
	resync()
	resync()
	assert.Equal(t, before+3, loadErrorCount(t, p.Name()))

	// After a recovery the first content fails anew.
	writeAtomic(t, keyPath, other.KeyPEM)
	waitServes(t, p, other)
	writeAtomic(t, certPath, garbage)
	counted(4)
	resync()
	resync()
	assert.Equal(t, before+4, loadErrorCount(t, p.Name()))
	klog.Flush()
	out := logs.String()
	assert.Equal(t, 4, countErrLines(out))

	// One Warning Event per counted failure, one Normal Event for the
	// rotation; nothing else.
	var warnings, rotations int
	for _, e := range certreporttest.Drain(recorder) {
		switch {
		case strings.HasPrefix(e, "Warning "+ReasonCertificateLoadFailed+" Load "):
			warnings++
			assert.Contains(t, e, p.Name(), "the Event names the provider")
		case strings.HasPrefix(e, "Normal "+ReasonCertificateRotated+" Rotate "):
			rotations++
			assert.Contains(t, e, other.Cert.SerialNumber.Text(16))
		default:
			t.Errorf("unexpected Event %q", e)
		}
	}
	assert.Equal(t, 4, warnings, "CertificateLoadFailed Events")
	assert.Equal(t, 1, rotations, "CertificateRotated Events")

	// The load itself was logged, with the serial...
	assert.Contains(t, out, "Loaded certificate")
	assert.Contains(t, out, other.Cert.SerialNumber.Text(16))
	// ...and key material never is, even at -v=10.
	assert.NotContains(t, out, "PRIVATE KEY")
	for _, leaf := range []*pki.Issued{good, other} {
		block, _ := pem.Decode(leaf.KeyPEM)
		require.NotNil(t, block)
		assert.NotContains(t, out, base64.StdEncoding.EncodeToString(block.Bytes)[:32])
	}
}

// TestFileCertKeyRunReturnsAndLeaksNothing is not parallel: it counts the
// process's goroutines.
func TestFileCertKeyRunReturnsAndLeaksNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing bool
		noWatch bool
	}{
		{name: "watching"},
		{name: "directory missing, retrying", missing: true},
		{name: "watcher disabled", noWatch: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := root
			if tc.missing {
				dir = filepath.Join(root, "missing")
			} else {
				leaf := fileLeaf(t)
				writeAtomic(t, filepath.Join(dir, "tls.crt"), leaf.CertPEM)
				writeAtomic(t, filepath.Join(dir, "tls.key"), leaf.KeyPEM)
			}
			certPath, keyPath := plainPaths(dir)
			p := newTestFileCertKey(t, certPath, keyPath)
			p.src.noWatch = tc.noWatch
			runtime.GC()
			baseline := runtime.NumGoroutine()

			var synced atomic.Int64
			p.src.afterSync = func() { synced.Add(1) }
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				p.Run(ctx, 4)
			}()
			require.Eventually(t, func() bool { return synced.Load() > 0 }, fileWait, fileTick)
			if !tc.missing {
				leaf := fileLeaf(t)
				writeAtomic(t, certPath, leaf.CertPEM)
				writeAtomic(t, keyPath, leaf.KeyPEM)
				if !tc.noWatch {
					waitServes(t, p, leaf)
				}
			} else {
				time.Sleep(300 * time.Millisecond) // a few retries
			}
			cancel()
			select {
			case <-done:
			case <-time.After(fileWait):
				t.Fatal("Run did not return after cancellation")
			}
			// Polled by hand: require.Eventually runs its condition in a
			// goroutine of its own.
			deadline := time.Now().Add(fileWait)
			for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
				time.Sleep(fileTick)
			}
			if n := runtime.NumGoroutine(); n > baseline {
				buf := make([]byte, 1<<20)
				t.Fatalf("goroutines: baseline %d, now %d:\n%s", baseline, n, buf[:runtime.Stack(buf, true)])
			}
		})
	}
}

func TestReadPEMFileIsBounded(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(64<<20))
	require.NoError(t, f.Close())
	data, err := readPEMFile(path)
	require.NoError(t, err)
	assert.Len(t, data, pki.MaxPEMSize+1)
}
