package server

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/errlog"
	"github.com/evercert/evercert/internal/notify"
)

// bundleFileKind is the kind label of the --ca-bundle-file writes in
// evercert_cabundle_publish_total: result "success" for each write, "error"
// for each failed one.
const bundleFileKind = "CABundleFile"

// Retries of a failed bundle file write back off from bundleFileRetryInitial
// to bundleFileRetryCap (plus jitter), on the injected clock.
const (
	bundleFileRetryInitial = time.Second
	bundleFileRetryCap     = 5 * time.Minute
)

// bundleFileWriter keeps a file equal to a CA provider's bundle, so clients
// such as curl can trust a rotating self-signed CA. It is also a
// authority.Observer of that provider, named "ca-bundle-file": a
// successor CA signs only once the file holds it.
type bundleFileWriter struct {
	path    string
	source  dynamiccertificates.CAContentProvider
	clock   clock.WithTicker
	changed chan struct{}

	mu      sync.Mutex
	written []byte

	listeners notify.Listeners
}

var (
	_ authority.Observer           = &bundleFileWriter{}
	_ dynamiccertificates.Notifier = &bundleFileWriter{}
	_ dynamiccertificates.Listener = &bundleFileWriter{}
)

// hasWritten reports whether the file has been written at least once.
func (w *bundleFileWriter) hasWritten() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written != nil
}

// Name implements authority.Observer.
func (w *bundleFileWriter) Name() string { return "ca-bundle-file" }

// Observed implements authority.Observer: the file as last written holds
// ca.
func (w *bundleFileWriter) Observed(ca *x509.Certificate) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return authority.BundleHolds(w.written, ca)
}

// AddListener implements dynamiccertificates.Notifier: l is told after
// every successful write, so an issuer waiting for the file re-checks.
func (w *bundleFileWriter) AddListener(l dynamiccertificates.Listener) { w.listeners.Add(l) }

func newBundleFileWriter(path string, source dynamiccertificates.CAContentProvider, clk clock.WithTicker) *bundleFileWriter {
	w := &bundleFileWriter{path: path, source: source, clock: clk, changed: make(chan struct{}, 1)}
	source.AddListener(w)
	return w
}

// Enqueue implements dynamiccertificates.Listener. Notifications coalesce:
// one pending write covers any number of changes.
func (w *bundleFileWriter) Enqueue() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// run writes the bundle at start and at every change until ctx is done. A failed write
// is retried with exponential backoff on w.clock until one succeeds; a
// change in between is written at once (and, failing, keeps backing off).
// Each distinct error is logged once, and recovery is logged, on the
// logger of ctx.
func (w *bundleFileWriter) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	b := backoff.New(bundleFileRetryInitial, bundleFileRetryCap)
	var (
		retry   clock.Timer // non-nil while a retry is pending
		failing errlog.Once
	)
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	// Write what the source holds now: without a RunOnce first, and for a
	// source whose content predates the writer (a self-signed CA is made
	// when it is built), no change may ever be announced. A bundle already
	// written is not written again.
	w.Enqueue()
	for {
		var retryC <-chan time.Time
		if retry != nil {
			retryC = retry.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-w.changed:
		case <-retryC:
		}
		if retry != nil {
			retry.Stop()
			retry = nil
		}
		err := w.write(logger)
		if err == nil {
			failing.Recovered(logger, "Wrote CA bundle file after failures", "path", w.path)
			b.Reset()
			continue
		}
		delay := b.Next(err)
		failing.Error(logger, err, "Writing CA bundle file failed; clients may not trust the next certificate until it succeeds. Retrying with backoff", "path", w.path, "retryIn", delay)
		retry = w.clock.NewTimer(delay)
	}
}

// write replaces the file atomically (temp file + rename in the same
// directory) so a reader never sees a partial bundle. The bundle is public
// data: 0644. It counts every attempt that had something to write in
// evercert_cabundle_publish_total{kind="CABundleFile"}. Errors do not name
// the random temporary file, so that a repeated failure reads the same.
func (w *bundleFileWriter) write(logger klog.Logger) error {
	bundle := w.source.CurrentCABundleContent()
	w.mu.Lock()
	same := bytes.Equal(bundle, w.written)
	w.mu.Unlock()
	if same {
		return nil
	}
	if err := w.replace(bundle); err != nil {
		certmetrics.CABundlePublished(bundleFileKind, "error")
		return fmt.Errorf("writing CA bundle %s: %w", w.path, err)
	}
	certmetrics.CABundlePublished(bundleFileKind, "success")
	w.mu.Lock()
	w.written = bundle
	w.mu.Unlock()
	logger.V(2).Info("Wrote CA bundle file", "path", w.path, "bytes", len(bundle))
	w.listeners.Notify()
	return nil
}

func (w *bundleFileWriter) replace(bundle []byte) error {
	dir := filepath.Dir(w.path)
	tmp, err := os.CreateTemp(dir, ".ca-bundle-*")
	if err != nil {
		return fmt.Errorf("creating a temporary file in %s: %w", dir, pathErrCause(err))
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(bundle); err != nil {
		tmp.Close()
		return fmt.Errorf("writing a temporary file in %s: %w", dir, pathErrCause(err))
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod of a temporary file in %s: %w", dir, pathErrCause(err))
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("closing a temporary file in %s: %w", dir, pathErrCause(err))
	}
	if err := os.Rename(tmp.Name(), w.path); err != nil {
		return fmt.Errorf("renaming a temporary file to %s: %w", w.path, pathErrCause(err))
	}
	return nil
}

// pathErrCause strips the path (a random temporary name) from os errors.
func pathErrCause(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}
