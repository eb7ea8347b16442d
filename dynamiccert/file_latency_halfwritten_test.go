package dynamiccert

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// The watch loop reads the files as soon as an event arrives. These tests
// check that this fast path keeps the protection against a half-written
// pair: the old pair is served until the matching key lands, the failure
// is not reported while the change may still complete, is reported once
// if it outlasts the grace, and the new pair is taken on the key's event.

// loadCounter runs p.Run until the test ends, like startRun, and counts the
// loop's loads.
func loadCounter(t *testing.T, src *fileSource, run func(context.Context, int)) *atomic.Int64 {
	t.Helper()
	var loads atomic.Int64
	started := make(chan struct{})
	var once sync.Once
	src.afterSync = func() {
		loads.Add(1)
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
	return &loads
}

// waitLoads waits until the loop has loaded more than after+n times.
func waitLoads(t *testing.T, loads *atomic.Int64, after, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return loads.Load() > after+n }, fileWait, time.Millisecond, "the watch loop did not re-read the files")
}

// servingServer serves whatever p currently serves over real TLS on
// 127.0.0.1.
func servingServer(t *testing.T, p *FileCertKey) string {
	return tlstest.Server(t, &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			kp := p.current()
			if kp == nil {
				return nil, errors.New("nothing to serve")
			}
			return &kp.TLS, nil
		},
	})
}

func handshakeSerial(t *testing.T, addr string) string {
	t.Helper()
	cert, err := tlstest.Handshake(addr, &tls.Config{InsecureSkipVerify: true, ServerName: "file.example.com"})
	require.NoError(t, err)
	return cert.SerialNumber.Text(16)
}

func rejectedLines(out, provider string) int {
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "Rejected new content") && strings.Contains(line, fmt.Sprintf("%q", provider)) {
			n++
		}
	}
	return n
}

// TestFileCertKeyHalfWrittenPairOutlastsGrace: the certificate is replaced
// and the key stays old for longer than the grace. The old pair is served
// throughout, over real handshakes; the mismatch is counted and logged once
// (not once per re-read); the new pair is served on the key's event, with
// the resync ticker on a fake clock that never fires. Not parallel: it
// captures the global klog output.
func TestFileCertKeyHalfWrittenPairOutlastsGrace(t *testing.T) {
	logs := captureKlog(t)
	dir := t.TempDir()
	certPath, keyPath := plainPaths(dir)
	old := fileLeaf(t)
	require.NoError(t, os.WriteFile(certPath, old.CertPEM, 0o644))
	require.NoError(t, os.WriteFile(keyPath, old.KeyPEM, 0o644))
	fake := clocktesting.NewFakeClock(time.Now())
	p := newTestFileCertKey(t, certPath, keyPath, func(c *FileCertKeyConfig) { c.Clock = fake })
	l := &countingListener{}
	p.AddListener(l)
	require.NoError(t, p.RunOnce(context.Background()))
	addr := servingServer(t, p)
	loads := loadCounter(t, p.src, p.Run)
	notified := l.n.Load()
	errorsBefore := loadErrorCount(t, p.Name())
	oldSerial := old.Cert.SerialNumber.Text(16)

	// The certificate is rewritten in place; the key is not, yet.
	next := fileLeaf(t)
	before := loads.Load()
	require.NoError(t, os.WriteFile(certPath, next.CertPEM, 0o644))
	waitLoads(t, loads, before, 0)
	require.Eventually(t, func() bool { return errors.Is(p.LastError(), pki.ErrKeyMismatch) }, fileWait, fileTick,
		"the mismatch is reported once it outlasts the grace")
	// Give re-reads, were there any left, time to happen, and handshake
	// all the while: the old pair is what is served.
	for end := time.Now().Add(4 * p.src.grace); time.Now().Before(end); {
		require.Equal(t, oldSerial, handshakeSerial(t, addr))
	}
	assertServes(t, p, old)
	assert.Equal(t, notified, l.n.Load(), "no notification for a rejected pair")
	klog.Flush()
	assert.Equal(t, 1, rejectedLines(logs.String(), p.Name()), "the half-written pair is logged once:\n%s", logs.String())
	// Counted once as a rule; an event of the certificate's write that the
	// loop only got to after the grace (a starved machine) would count
	// again, and still not log again.
	errorsAfter := loadErrorCount(t, p.Name())
	assert.GreaterOrEqual(t, errorsAfter, errorsBefore+1, "counted")

	// The key lands: its event alone (the fake clock never ticks) serves
	// the new pair.
	start := time.Now()
	require.NoError(t, os.WriteFile(keyPath, next.KeyPEM, 0o644))
	waitServes(t, p, next)
	t.Logf("new pair served %v after the key was written", time.Since(start))
	assert.Equal(t, next.Cert.SerialNumber.Text(16), handshakeSerial(t, addr))
	assert.NoError(t, p.LastError())
	waitNotified(t, l, notified)
	klog.Flush()
	out := logs.String()
	assert.Equal(t, 1, rejectedLines(out, p.Name()), "recovery logs no error:\n%s", out)
	assert.Equal(t, errorsAfter, loadErrorCount(t, p.Name()), "recovery counts no error")
	assert.Contains(t, out, "Loaded certificate", "the recovery is logged")
}

// TestFileCertKeyHalfWrittenPairWithinGrace: while a change may still
// complete (the grace is an hour here), a half-written pair is re-read but
// neither served, counted, logged nor returned by LastError, however many
// times it is seen; the matching key then serves the new pair. Every file
// pattern is tried, for the certificate and the key alike.
func TestFileCertKeyHalfWrittenPairWithinGrace(t *testing.T) {
	logs := captureKlog(t)
	writers := map[string]func(t *testing.T, path string, data []byte){
		"in-place": func(t *testing.T, path string, data []byte) {
			require.NoError(t, os.WriteFile(path, data, 0o644))
		},
		"rename-over": func(t *testing.T, path string, data []byte) { writeAtomic(t, path, data) },
		"remove-recreate": func(t *testing.T, path string, data []byte) {
			require.NoError(t, os.Remove(path))
			require.NoError(t, os.WriteFile(path, data, 0o644))
		},
		// Truncated first, the rest later: an empty file in between.
		"truncate-then-write": func(t *testing.T, path string, data []byte) {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			require.NoError(t, err)
			require.NoError(t, f.Sync())
			_, err = f.Write(data)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		},
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for name := range writers {
			if !yield(name) {
				return
			}
		}
	})
	for _, name := range names {
		write := writers[name]
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			certPath, keyPath := plainPaths(dir)
			old := fileLeaf(t)
			writeAtomic(t, certPath, old.CertPEM)
			writeAtomic(t, keyPath, old.KeyPEM)
			fake := clocktesting.NewFakeClock(time.Now())
			p := newTestFileCertKey(t, certPath, keyPath, func(c *FileCertKeyConfig) { c.Clock = fake })
			p.src.grace = time.Hour
			l := &countingListener{}
			p.AddListener(l)
			require.NoError(t, p.RunOnce(context.Background()))
			loads := loadCounter(t, p.src, p.Run)
			notified := l.n.Load()
			errorsBefore := loadErrorCount(t, p.Name())

			for _, half := range []struct{ path, other string }{{certPath, keyPath}, {keyPath, certPath}} {
				next := fileLeaf(t)
				data := map[string][]byte{certPath: next.CertPEM, keyPath: next.KeyPEM}
				before := loads.Load()
				write(t, half.path, data[half.path])
				// The event and several backoff re-reads.
				waitLoads(t, loads, before, 5)
				assertServes(t, p, old)
				assert.NoError(t, p.LastError(), "not reported within the grace")
				assert.Equal(t, errorsBefore, loadErrorCount(t, p.Name()), "not counted within the grace")
				assert.Equal(t, notified, l.n.Load(), "not notified")

				write(t, half.other, data[half.other])
				waitServes(t, p, next)
				waitNotified(t, l, notified)
				notified = l.n.Load()
				old = next
			}
			klog.Flush()
			assert.Zero(t, rejectedLines(logs.String(), p.Name()), "nothing logged:\n%s", logs.String())
			assert.NoError(t, p.LastError())
		})
	}
}

// TestFileCAPartialBundleWithinGrace: a CA bundle truncated and written in
// two steps is not reported while the grace runs, and the complete bundle
// is taken on its event.
func TestFileCAPartialBundleWithinGrace(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ca.crt")
	ca1 := newTestCA(t, "ca-one", time.Now(), time.Hour)
	ca2 := newTestCA(t, "ca-two", time.Now(), time.Hour)
	require.NoError(t, os.WriteFile(path, ca1.CertPEM, 0o644))
	fake := clocktesting.NewFakeClock(time.Now())
	p, err := NewFileCA(FileCAConfig{Name: "test:" + t.Name(), File: path, Clock: fake})
	require.NoError(t, err)
	p.src.grace = time.Hour
	require.NoError(t, p.RunOnce(context.Background()))
	loads := loadCounter(t, p.src, p.Run)

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	require.NoError(t, err)
	half := len(ca2.CertPEM) / 2
	_, err = f.Write(ca2.CertPEM[:half])
	require.NoError(t, err)
	before := loads.Load()
	require.NoError(t, f.Sync())
	waitLoads(t, loads, before, 3)
	assert.NoError(t, p.LastError(), "a partial bundle is not reported within the grace")
	assert.Equal(t, ca1.CertPEM, p.CurrentCABundleContent())

	_, err = f.Write(ca2.CertPEM[half:])
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.Eventually(t, func() bool { return string(p.CurrentCABundleContent()) == string(ca2.CertPEM) }, fileWait, fileTick)
	assert.NoError(t, p.LastError())
}

// TestFileCertKeyNoisyDirectory: unrelated files written all the time in
// the watched directory do not keep the loop from taking a rotation.
func TestFileCertKeyNoisyDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certPath, keyPath := plainPaths(dir)
	first := fileLeaf(t)
	writeAtomic(t, certPath, first.CertPEM)
	writeAtomic(t, keyPath, first.KeyPEM)
	fake := clocktesting.NewFakeClock(time.Now())
	p := newTestFileCertKey(t, certPath, keyPath, func(c *FileCertKeyConfig) { c.Clock = fake })
	require.NoError(t, p.RunOnce(context.Background()))
	loads := loadCounter(t, p.src, p.Run)

	stop := make(chan struct{})
	var noise sync.WaitGroup
	var written atomic.Int64
	noise.Go(func() {
		log := filepath.Join(dir, "noise.log")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := os.WriteFile(log, []byte(fmt.Sprint(i)), 0o644); err != nil {
				t.Error(err)
				return
			}
			written.Add(1)
		}
	})
	defer func() {
		close(stop)
		noise.Wait()
	}()
	require.Eventually(t, func() bool { return written.Load() > 100 }, fileWait, time.Millisecond)

	for range 3 {
		next := fileLeaf(t)
		writeAtomic(t, certPath, next.CertPEM)
		writeAtomic(t, keyPath, next.KeyPEM)
		waitServes(t, p, next)
	}
	t.Logf("%d unrelated writes, %d loads", written.Load(), loads.Load())
}

// TestWalkSymlinks checks the resolution against filepath.EvalSymlinks and
// the paths it reports as relevant, for a kubelet-style volume and others.
func TestWalkSymlinks(t *testing.T) {
	t.Parallel()
	root, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	mk := func(rel string) string {
		p := filepath.Join(root, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		return p
	}
	link := func(target, rel string) { require.NoError(t, os.Symlink(target, mk(rel))) }
	file := func(rel string) { require.NoError(t, os.WriteFile(mk(rel), []byte("x"), 0o644)) }

	// kubelet: vol/tls.crt -> ..data/tls.crt, vol/..data -> ..2026_x
	file("vol/..2026_x/tls.crt")
	link("..2026_x", "vol/..data")
	link("..data/tls.crt", "vol/tls.crt")
	// absolute link into another directory, through a relative one
	file("store/real.crt")
	link(filepath.Join(root, "store", "real.crt"), "links/abs.crt")
	link("../links/abs.crt", "other/rel.crt")
	// a symlinked directory on the way
	link("vol", "alias")
	// a loop
	link("loop-b", "loop-a")
	link("loop-a", "loop-b")

	for _, tc := range []struct {
		path     string
		relevant []string
	}{
		{path: "vol/tls.crt", relevant: []string{"vol/tls.crt", "vol/..data", "vol/..2026_x", "vol/..2026_x/tls.crt"}},
		{path: "other/rel.crt", relevant: []string{"other/rel.crt", "links", "links/abs.crt", "store/real.crt"}},
		{path: "alias/tls.crt", relevant: []string{"alias", "vol/tls.crt", "vol/..data", "vol/..2026_x/tls.crt"}},
		{path: "store/real.crt", relevant: []string{"store", "store/real.crt"}},
		{path: "vol/missing/tls.crt", relevant: []string{"vol/missing"}},
		{path: "loop-a", relevant: []string{"loop-a", "loop-b"}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			path := filepath.Join(root, tc.path)
			visited := map[string]bool{}
			got, err := walkSymlinks(path, func(v string) { visited[v] = true })
			want, wantErr := filepath.EvalSymlinks(path)
			if wantErr != nil {
				assert.Error(t, err)
			} else {
				require.NoError(t, err)
				assert.Equal(t, want, got)
			}
			for _, rel := range tc.relevant {
				assert.True(t, visited[filepath.Join(root, rel)], "%s visited; got %v", rel, visited)
			}
			assert.False(t, visited[filepath.Join(root, "vol", "..data_tmp")])
		})
	}
}

// TestWatchLoopRelevantEvents: which event names make the loop read at
// once, for a kubelet-style volume reached through a symlinked directory.
func TestWatchLoopRelevantEvents(t *testing.T) {
	t.Parallel()
	root, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	vol := filepath.Join(root, "vol")
	leaf := fileLeaf(t)
	ts := filepath.Join(vol, "..2026_x")
	require.NoError(t, os.MkdirAll(ts, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ts, "tls.crt"), leaf.CertPEM, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ts, "tls.key"), leaf.KeyPEM, 0o644))
	require.NoError(t, os.Symlink("..2026_x", filepath.Join(vol, "..data")))
	for _, name := range []string{"tls.crt", "tls.key"} {
		require.NoError(t, os.Symlink(filepath.Join("..data", name), filepath.Join(vol, name)))
	}
	require.NoError(t, os.Symlink("vol", filepath.Join(root, "alias")))
	alias := filepath.Join(root, "alias")

	src, err := newFileSource("test", newReporter("test", nil, nil), 0, nil, filepath.Join(alias, "tls.crt"), filepath.Join(alias, "tls.key"))
	require.NoError(t, err)
	l := &watchLoop{s: src, realDirs: map[string]string{}, retryDelay: fileRetryMin}
	defer l.closeWatcher()
	defer l.retry.stop()
	l.ensureWatch()

	for name, want := range map[string]bool{
		filepath.Join(alias, "tls.crt"):         true,
		filepath.Join(alias, "..data"):          true,
		filepath.Join(vol, "..data"):            true,
		filepath.Join(ts, "tls.key"):            true,
		alias:                                   true,
		filepath.Join(alias, "..data_tmp"):      false,
		filepath.Join(alias, "..2026_y"):        false,
		filepath.Join(alias, "unrelated.log"):   false,
		filepath.Join(ts, "unrelated"):          false,
		filepath.Join(root, "elsewhere", "tls"): false,
	} {
		assert.Equal(t, want, l.isRelevant(name), name)
	}
}
