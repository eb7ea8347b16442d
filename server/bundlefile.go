package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"
)

// bundleFileWriter keeps a file equal to a CA provider's bundle, so clients
// such as curl can trust a rotating self-signed CA.
type bundleFileWriter struct {
	path    string
	source  dynamiccertificates.CAContentProvider
	changed chan struct{}
	written []byte
}

func newBundleFileWriter(path string, source dynamiccertificates.CAContentProvider) *bundleFileWriter {
	w := &bundleFileWriter{path: path, source: source, changed: make(chan struct{}, 1)}
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

func (w *bundleFileWriter) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.changed:
			if err := w.write(); err != nil {
				klog.ErrorS(err, "Writing CA bundle file failed; clients may not trust the next certificate", "path", w.path)
			}
		}
	}
}

// write replaces the file atomically (temp file + rename in the same
// directory) so a reader never sees a partial bundle. The bundle is public
// data: 0644.
func (w *bundleFileWriter) write() error {
	bundle := w.source.CurrentCABundleContent()
	if bytes.Equal(bundle, w.written) {
		return nil
	}
	dir := filepath.Dir(w.path)
	tmp, err := os.CreateTemp(dir, ".ca-bundle-*")
	if err != nil {
		return fmt.Errorf("writing CA bundle %s: %w", w.path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(bundle); err != nil {
		tmp.Close()
		return fmt.Errorf("writing CA bundle %s: %w", w.path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("writing CA bundle %s: %w", w.path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing CA bundle %s: %w", w.path, err)
	}
	if err := os.Rename(tmp.Name(), w.path); err != nil {
		return fmt.Errorf("writing CA bundle %s: %w", w.path, err)
	}
	w.written = bundle
	klog.V(2).InfoS("Wrote CA bundle file", "path", w.path, "bytes", len(bundle))
	return nil
}
