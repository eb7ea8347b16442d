package dynamiccert

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/errlog"
	"github.com/evercert/evercert/internal/pki"
)

// DefaultFileResyncInterval is how often file providers re-read their files
// even when no filesystem event arrived.
const DefaultFileResyncInterval = time.Minute

// Timings of the watch loop. They run on the real clock, not the injected
// one: filesystem events are real, and a fake clock would stall them.
var (
	// defaultFileSettleGrace is how long content read after a filesystem
	// event may stay invalid before the failure is reported (counted,
	// logged, returned by LastError). A writer that replaces a certificate
	// and its key one after the other passes through invalid states (an
	// empty file, a new certificate with the old key); those are re-read
	// at once on the next event and retried with a short backoff, but
	// reported only if they outlast the grace.
	defaultFileSettleGrace = 250 * time.Millisecond
	// fileRecheckMin and fileRecheckMax bound that backoff.
	fileRecheckMin = 2 * time.Millisecond
	fileRecheckMax = 50 * time.Millisecond
	// fileEventBurst events are acted on at once; past that, reads
	// triggered by events are limited to one per fileEventRefill, so that
	// unrelated files changing all the time in a watched directory cost
	// little.
	fileEventBurst  = 8
	fileEventRefill = 10 * time.Millisecond
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
	// grace is how long a failure seen after a filesystem event stays
	// unreported while the files settle (defaultFileSettleGrace).
	grace time.Duration

	// loadMu serializes loads (RunOnce and Run may race).
	loadMu sync.Mutex
	// report reports each change, and each distinct failure, once.
	report *reporter
}

func newFileSource(name string, report *reporter, resync time.Duration, clk clock.WithTicker, files ...string) (*fileSource, error) {
	if resync < 0 {
		return nil, fmt.Errorf("%s: resync interval must not be negative, got %v", name, resync)
	}
	if resync == 0 {
		resync = DefaultFileResyncInterval
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	s := &fileSource{name: name, clock: clk, resync: resync, grace: defaultFileSettleGrace, report: report}
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		s.paths = append(s.paths, abs)
	}
	return s, nil
}

// reported reports err, if any, as a failed load, and returns it.
func (s *fileSource) reported(err error) error {
	if err != nil {
		return s.report.failed(err)
	}
	return nil
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
	t  *time.Timer
	c  <-chan time.Time
	at time.Time // when it fires, while active
}

func (r *realTimer) reset(d time.Duration) {
	if r.t == nil {
		r.t = time.NewTimer(d)
	} else {
		r.t.Reset(d)
	}
	r.c = r.t.C
	r.at = time.Now().Add(d)
}

// resetEarlier arms the timer for d from now unless it is already armed
// to fire sooner.
func (r *realTimer) resetEarlier(d time.Duration) {
	if r.active() && !time.Now().Add(d).Before(r.at) {
		return
	}
	r.reset(d)
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
	s    *fileSource
	load func() error // loads without reporting failures

	w           *fsnotify.Watcher
	retry       realTimer
	retryDelay  time.Duration
	desired     map[string]bool
	problemsLog errlog.Once // logs each distinct watch problem once
	// relevant and realDirs tell which events concern the files (see
	// watchDirs): realDirs maps each watched directory to its resolved
	// path.
	relevant map[string]bool
	realDirs map[string]string

	// recheck fires the next read while content read after an event is
	// not valid yet (since failingSince), or while events are
	// rate-limited.
	recheck      realTimer
	recheckDelay time.Duration
	failingSince time.Time

	// A token bucket for reads triggered by events: tokens left, and when
	// the last one was added back.
	tokens   int
	refilled time.Time
}

// run blocks until ctx is done. load must load the files and return its
// error without reporting it; run decides when a failure is reported.
//
// run loads at start and on every resync tick of the injected clock, and
// reports the result. On a filesystem event in the files' directories, or
// when a missing directory becomes watchable, it loads at once; if the
// content is not valid (yet), it re-reads on every further event and with
// a short backoff, and reports the failure only if it lasts for the grace
// period. So a half-written pair is never served, the complete pair is
// served as soon as its last byte is written, and a writer that updates
// the files one after the other does not log errors. It starts no
// goroutine of its own; the fsnotify watcher's reader goroutine is closed
// before run returns.
func (s *fileSource) run(ctx context.Context, load func() error) {
	klog.FromContext(ctx).Info("Starting file certificate watch", "provider", s.name, "files", s.paths, "resync", s.resync)
	defer klog.FromContext(ctx).Info("Stopped file certificate watch", "provider", s.name)

	l := &watchLoop{
		s:          s,
		load:       load,
		retryDelay: fileRetryMin,
		tokens:     fileEventBurst,
		refilled:   time.Now(),
		realDirs:   map[string]string{},
	}
	if s.afterSync != nil {
		l.load = func() error {
			err := load()
			s.afterSync()
			return err
		}
	}
	ticker := s.clock.NewTicker(s.resync)
	defer ticker.Stop()
	defer l.recheck.stop()
	defer l.retry.stop()
	defer l.closeWatcher()

	l.ensureWatch()
	l.checkAndReport()
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
			l.checkAndReport()

		case ev, ok := <-events:
			if !ok {
				l.watcherFailed(errors.New("fsnotify event channel closed"))
				continue
			}
			klog.FromContext(ctx).V(5).Info("File event", "provider", s.name, "event", ev.String())
			if (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) && l.desired[ev.Name] {
				// A watched directory itself went away: drop its watch (it
				// may already be gone) so that ensureWatch adds it again
				// once the directory is back.
				_ = l.w.Remove(ev.Name)
			}
			if l.isRelevant(ev.Name) {
				l.ensureWatch()
				l.check()
			} else {
				l.changed()
			}

		case err, ok := <-errs:
			if !ok {
				l.watcherFailed(errors.New("fsnotify error channel closed"))
				continue
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Events were lost, the watches are fine: just re-read.
				klog.FromContext(ctx).V(2).Info("File events overflowed, re-reading", "provider", s.name)
				l.ensureWatch()
				l.check()
				continue
			}
			l.watcherFailed(err)

		case <-l.recheck.c:
			l.recheck.fired()
			if l.failingSince.IsZero() {
				// Rate-limited events: spend the token that is due.
				l.changed()
			} else {
				l.check()
			}

		case <-l.retry.c:
			l.retry.fired()
			if l.ensureWatch() {
				// Something became watchable: its content may have
				// appeared before the watch did.
				l.check()
			}
		}
	}
}

// isRelevant reports whether an event on name may change what the files
// resolve to or contain: name is a watched directory, or one of the paths
// visited when the files were last resolved.
func (l *watchLoop) isRelevant(name string) bool {
	if l.desired[name] || l.relevant[name] {
		return true
	}
	if dir, ok := l.realDirs[filepath.Dir(name)]; ok {
		return l.relevant[filepath.Join(dir, filepath.Base(name))]
	}
	return false
}

// changed reacts to an event on some other entry of a watched directory:
// it reads the files at once too, unless such events are so frequent that
// the token bucket is empty; the read is then deferred until a token is
// due.
func (l *watchLoop) changed() {
	now := time.Now()
	if l.tokens < fileEventBurst {
		if n := int(now.Sub(l.refilled) / fileEventRefill); n > 0 {
			l.tokens = min(fileEventBurst, l.tokens+n)
			l.refilled = l.refilled.Add(time.Duration(n) * fileEventRefill)
		}
	}
	if l.tokens == 0 {
		l.recheck.resetEarlier(fileEventRefill - now.Sub(l.refilled))
		return
	}
	if l.tokens == fileEventBurst {
		l.refilled = now
	}
	l.tokens--
	l.ensureWatch()
	l.check()
}

// check reads the files after an event. A failure starts (or continues) a
// settling period: the files are re-read with a short backoff, and the
// failure is reported only if it is still there once the grace period has
// passed. Success ends the period; nothing that happened in it is
// reported.
func (l *watchLoop) check() {
	err := l.load()
	if err == nil {
		l.settled()
		return
	}
	now := time.Now()
	if l.failingSince.IsZero() {
		l.failingSince = now
		l.recheckDelay = fileRecheckMin
		klog.Background().V(4).Info("Files not valid yet, re-checking", "provider", l.s.name, "err", err)
	}
	deadline := l.failingSince.Add(l.s.grace)
	if !now.Before(deadline) {
		_ = l.s.reported(err)
		l.settled()
		return
	}
	l.recheck.reset(min(l.recheckDelay, deadline.Sub(now)))
	l.recheckDelay = min(2*l.recheckDelay, fileRecheckMax)
}

// checkAndReport reads the files and reports a failure at once: at start
// and on resync ticks. A tick during a settling period ends it: the resync
// is the safety net, and what it reads is what is reported.
func (l *watchLoop) checkAndReport() {
	_ = l.s.reported(l.load())
	l.settled()
}

// settled ends a settling period.
func (l *watchLoop) settled() {
	l.failingSince = time.Time{}
	l.recheck.stop()
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
	l.check()
}

// problem logs a watch problem once per distinct message.
func (l *watchLoop) problem(err error) {
	l.problemsLog.Error(klog.Background(), err, "File watch problem; periodic re-reads continue", "provider", l.s.name)
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
	l.desired, l.relevant = l.s.watchDirs()
	clear(l.realDirs)
	for d := range l.desired {
		if resolved, err := filepath.EvalSymlinks(d); err == nil {
			l.realDirs[d] = resolved
		}
	}
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
				klog.Background().V(4).Info("Directory does not exist yet, will watch it when it appears", "provider", l.s.name, "dir", d)
			} else {
				l.problem(fmt.Errorf("watching %s: %w", d, err))
			}
			continue
		}
		klog.Background().V(4).Info("Watching directory", "provider", l.s.name, "dir", d)
		added = true
	}
	if missing {
		l.armRetry()
	} else {
		l.retry.stop()
		l.retryDelay = fileRetryMin
		l.problemsLog.Reset()
	}
	return added
}

// watchDirs returns the directories to watch: the parent of every file and,
// when a file is a symlink into another directory, the parent of its target
// too (so that an in-place change of the target is seen). Watching
// directories rather than files survives the kubelet's ..data symlink swap,
// editors' rename-over and delete-then-create.
//
// It also returns the entries whose change changes what a file resolves
// to: every path visited while resolving it, each in the form <resolved
// directory>/<name> (see walkSymlinks). An event on one of them makes the
// loop read the files at once, always; other events in the watched
// directories do too, but rate-limited (see watchLoop.changed).
func (s *fileSource) watchDirs() (dirs, relevant map[string]bool) {
	dirs = map[string]bool{}
	relevant = map[string]bool{}
	for _, p := range s.paths {
		parent := filepath.Dir(p)
		dirs[parent] = true
		target, err := walkSymlinks(p, func(visited string) { relevant[visited] = true })
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
	return dirs, relevant
}

// maxSymlinks bounds the symlinks walkSymlinks follows, as
// filepath.EvalSymlinks does.
const maxSymlinks = 255

// walkSymlinks resolves the absolute path like filepath.EvalSymlinks and
// calls visit with every path it looks up on the way, including the ones
// that turn out to be symlinks and a missing one it stops at. Each visited
// path is a fully resolved directory joined with one name, so the change
// of any link, directory or file that the resolution depends on shows up
// as an event on a visited path.
func walkSymlinks(path string, visit func(string)) (string, error) {
	resolved := string(filepath.Separator)
	rest := strings.Split(filepath.Clean(path), string(filepath.Separator))
	links := 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			resolved = filepath.Dir(resolved)
			continue
		}
		next := filepath.Join(resolved, name)
		visit(next)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if links++; links > maxSymlinks {
			return "", &fs.PathError{Op: "walk", Path: path, Err: errors.New("too many symbolic links")}
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			resolved = string(filepath.Separator)
		}
		rest = append(strings.Split(target, string(filepath.Separator)), rest...)
	}
	return resolved, nil
}
