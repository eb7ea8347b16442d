package dynamiccert

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/pki"
)

// DefaultFileResyncInterval is how often file providers re-read their files
// even when no filesystem event arrived.
const DefaultFileResyncInterval = time.Minute

// Timings of the watch loop. They run on the real clock, not the injected
// one: filesystem events are real, and a fake clock would stall them.
var (
	// fileSettleDelay is how long the loop waits for more events after one
	// arrives, so that a burst (cert then key, a kubelet symlink swap) is
	// read once. Every event in a burst restarts it, up to fileMaxSettle
	// after the first event.
	fileSettleDelay = 20 * time.Millisecond
	fileMaxSettle   = 100 * time.Millisecond
	// fileRetryMin and fileRetryMax bound the backoff used to retry
	// watching a directory that does not exist (yet), or to recreate a
	// watcher that failed.
	fileRetryMin = 100 * time.Millisecond
	fileRetryMax = 500 * time.Millisecond
)

// fileSource is what FileCertKey and FileCA share: the files, the clock,
// serialized loads, error reporting, and the watch loop.
type fileSource struct {
	name   string
	paths  []string // absolute; read and watched
	clock  clock.WithTicker
	resync time.Duration
	// noWatch disables fsnotify so that only the resync ticker reloads.
	// Tests use it to exercise the safety net.
	noWatch bool
	// afterSync, if set, is called by the run loop after every reload.
	// Tests use it to know that the loop is up.
	afterSync func()

	// loadMu serializes loads (RunOnce and Run may race).
	loadMu sync.Mutex
	// report counts every failed load and logs each distinct error once.
	report *reporter
}

func newFileSource(name string, resync time.Duration, clk clock.WithTicker, files ...string) (*fileSource, error) {
	if resync < 0 {
		return nil, fmt.Errorf("%s: resync interval must not be negative, got %v", name, resync)
	}
	if resync == 0 {
		resync = DefaultFileResyncInterval
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	s := &fileSource{name: name, clock: clk, resync: resync, report: &reporter{name: name}}
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		s.paths = append(s.paths, abs)
	}
	return s, nil
}

// readPEMFile reads at most pki.MaxPEMSize+1 bytes of a regular file, so a
// huge file is not slurped and pki still sees that it is too large. The file
// is opened non-blocking so a FIFO cannot hang the loader; anything but a
// regular file is refused.
func readPEMFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("not a regular file (mode %s)", fi.Mode())}
	}
	data, err := io.ReadAll(io.LimitReader(f, pki.MaxPEMSize+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return data, nil
}

// realTimer is a resettable timer whose channel is nil while it is idle, so
// it can sit in a select unconditionally.
type realTimer struct {
	t *time.Timer
	c <-chan time.Time
}

func (r *realTimer) reset(d time.Duration) {
	if r.t == nil {
		r.t = time.NewTimer(d)
	} else {
		r.t.Reset(d)
	}
	r.c = r.t.C
}

func (r *realTimer) stop() {
	if r.t != nil {
		r.t.Stop()
	}
	r.c = nil
}

func (r *realTimer) active() bool { return r.c != nil }

// fired must be called after receiving from c.
func (r *realTimer) fired() { r.c = nil }

// watchLoop is the state of one run of fileSource.run. It is owned by the
// run goroutine.
type watchLoop struct {
	s      *fileSource
	reload func()

	w           *fsnotify.Watcher
	settle      realTimer
	burstStart  time.Time
	retry       realTimer
	retryDelay  time.Duration
	desired     map[string]bool
	lastProblem string
}

// run blocks until ctx is done. It calls reload once at start, after every
// burst of events in the files' directories, on every resync tick of the
// injected clock, and whenever a missing directory becomes watchable. It
// starts no goroutine of its own; the fsnotify watcher's reader goroutine is
// closed before run returns.
func (s *fileSource) run(ctx context.Context, reload func()) {
	klog.InfoS("Starting file certificate watch", "provider", s.name, "files", s.paths, "resync", s.resync)
	defer klog.InfoS("Stopped file certificate watch", "provider", s.name)

	l := &watchLoop{s: s, reload: reload, retryDelay: fileRetryMin}
	if s.afterSync != nil {
		l.reload = func() {
			reload()
			s.afterSync()
		}
	}
	ticker := s.clock.NewTicker(s.resync)
	defer ticker.Stop()
	defer l.settle.stop()
	defer l.retry.stop()
	defer l.closeWatcher()

	l.ensureWatch()
	l.reload()
	for {
		var (
			events <-chan fsnotify.Event
			errs   <-chan error
		)
		if l.w != nil {
			events, errs = l.w.Events, l.w.Errors
		}
		select {
		case <-ctx.Done():
			return

		case <-ticker.C():
			l.ensureWatch()
			l.reload()

		case ev, ok := <-events:
			if !ok {
				l.watcherFailed(errors.New("fsnotify event channel closed"))
				continue
			}
			klog.V(5).InfoS("File event", "provider", s.name, "event", ev.String())
			if (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) && l.desired[ev.Name] {
				// A watched directory itself went away: drop its watch (it
				// may already be gone) so that ensureWatch adds it again
				// once the directory is back.
				_ = l.w.Remove(ev.Name)
			}
			l.scheduleSettle()

		case err, ok := <-errs:
			if !ok {
				l.watcherFailed(errors.New("fsnotify error channel closed"))
				continue
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Events were lost, the watches are fine: just re-read.
				klog.V(2).InfoS("File events overflowed, re-reading", "provider", s.name)
				l.scheduleSettle()
				continue
			}
			l.watcherFailed(err)

		case <-l.settle.c:
			l.settle.fired()
			l.burstStart = time.Time{}
			l.ensureWatch()
			l.reload()

		case <-l.retry.c:
			l.retry.fired()
			if l.ensureWatch() {
				// Something became watchable: its content may have
				// appeared before the watch did.
				l.reload()
			}
		}
	}
}

func (l *watchLoop) scheduleSettle() {
	now := time.Now()
	if !l.settle.active() {
		l.burstStart = now
	}
	delay := min(fileSettleDelay, fileMaxSettle-now.Sub(l.burstStart))
	l.settle.reset(max(delay, 0))
}

func (l *watchLoop) closeWatcher() {
	if l.w != nil {
		// Close waits for the watcher's reader goroutine to exit.
		_ = l.w.Close()
		l.w = nil
	}
}

// watcherFailed drops the watcher, re-reads now (events may have been lost)
// and lets the retry timer build a new watcher with backoff.
func (l *watchLoop) watcherFailed(err error) {
	l.problem(fmt.Errorf("file watch failed, re-establishing it: %w", err))
	l.closeWatcher()
	l.armRetry()
	l.reload()
}

// problem logs a watch problem once per distinct message.
func (l *watchLoop) problem(err error) {
	if msg := err.Error(); msg != l.lastProblem {
		l.lastProblem = msg
		klog.ErrorS(err, "File watch problem; periodic re-reads continue", "provider", l.s.name)
	}
}

func (l *watchLoop) armRetry() {
	if l.retry.active() {
		return
	}
	l.retry.reset(l.retryDelay)
	l.retryDelay = min(2*l.retryDelay, fileRetryMax)
}

// ensureWatch makes sure there is a watcher and that it watches exactly the
// desired directories. It reports whether any watch was added (a new
// watcher counts), and arms the retry timer while something is missing.
func (l *watchLoop) ensureWatch() (added bool) {
	if l.s.noWatch {
		return false
	}
	if l.w == nil {
		w, err := fsnotify.NewWatcher()
		if err != nil {
			l.problem(fmt.Errorf("creating file watcher: %w", err))
			l.armRetry()
			return false
		}
		l.w = w
	}
	l.desired = l.s.watchDirs()
	have := map[string]bool{}
	for _, d := range l.w.WatchList() {
		have[d] = true
		if !l.desired[d] {
			_ = l.w.Remove(d)
		}
	}
	missing := false
	for d := range l.desired {
		if have[d] {
			continue
		}
		if err := l.w.Add(d); err != nil {
			missing = true
			if errors.Is(err, fs.ErrNotExist) {
				klog.V(4).InfoS("Directory does not exist yet, will watch it when it appears", "provider", l.s.name, "dir", d)
			} else {
				l.problem(fmt.Errorf("watching %s: %w", d, err))
			}
			continue
		}
		klog.V(4).InfoS("Watching directory", "provider", l.s.name, "dir", d)
		added = true
	}
	if missing {
		l.armRetry()
	} else {
		l.retry.stop()
		l.retryDelay = fileRetryMin
		l.lastProblem = ""
	}
	return added
}

// watchDirs returns the directories to watch: the parent of every file and,
// when a file is a symlink into another directory, the parent of its target
// too (so that an in-place change of the target is seen). Watching
// directories rather than files survives the kubelet's ..data symlink swap,
// editors' rename-over and delete-then-create.
func (s *fileSource) watchDirs() map[string]bool {
	dirs := map[string]bool{}
	for _, p := range s.paths {
		parent := filepath.Dir(p)
		dirs[parent] = true
		target, err := filepath.EvalSymlinks(p)
		if err != nil || target == p {
			continue
		}
		targetDir := filepath.Dir(target)
		if realParent, err := filepath.EvalSymlinks(parent); err == nil && realParent == targetDir {
			// Same directory reached through a symlinked path.
			continue
		}
		dirs[targetDir] = true
	}
	return dirs
}
