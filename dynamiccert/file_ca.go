package dynamiccert

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/pki"
)

// FileCAConfig configures a FileCA.
type FileCAConfig struct {
	// Name identifies the provider in logs and metrics. Default
	// "file:<File>".
	Name string
	// File is the PEM CA bundle. It does not have to exist when the provider
	// is created.
	File string
	// ResyncInterval is how often the file is re-read even without a
	// filesystem event. Default DefaultFileResyncInterval.
	ResyncInterval time.Duration
	// Clock drives the resync ticker. Default clock.RealClock{}.
	Clock clock.WithTicker
	// EventRecorder, with EventObject (the object the Events are about,
	// e.g. the Pod), receives a Warning CertificateLoadFailed Event for
	// every distinct load failure. Optional: no Events without both.
	EventRecorder events.EventRecorder
	EventObject   runtime.Object
}

// FileCA serves a CA bundle read from a file and reloads it on change, in
// the same way as FileCertKey: parent-directory watch read at once on every
// event plus periodic re-read, last good bundle kept when new content does
// not parse, a partly written file retried rather than reported, one log
// line per distinct error. The validity periods of the CAs are not checked:
// during a CA rotation a bundle legitimately holds expired CAs.
//
// FileCA implements dynamiccertificates.CAContentProvider, Notifier and
// ControllerRunner. It is safe for concurrent use.
type FileCA struct {
	listeners
	src  *fileSource
	file string

	cur atomic.Pointer[caContent]
}

var (
	_ dynamiccertificates.CAContentProvider = &FileCA{}
	_ dynamiccertificates.Notifier          = &FileCA{}
	_ dynamiccertificates.ControllerRunner  = &FileCA{}
)

// NewFileCA validates cfg and returns a provider that has no content yet.
// Call RunOnce to load the file now, and Run to keep it loaded.
func NewFileCA(cfg FileCAConfig) (*FileCA, error) {
	if cfg.File == "" {
		return nil, errors.New("file CA provider: missing CA bundle file")
	}
	name := cfg.Name
	if name == "" {
		name = "file:" + cfg.File
	}
	src, err := newFileSource(name, newReporter(name, cfg.EventRecorder, cfg.EventObject), cfg.ResyncInterval, cfg.Clock, cfg.File)
	if err != nil {
		return nil, err
	}
	return &FileCA{src: src, file: cfg.File}, nil
}

// Name returns the provider's name.
func (p *FileCA) Name() string { return p.src.name }

// CurrentCABundleContent returns the PEM bundle last loaded successfully, or
// nil before the first successful load.
func (p *FileCA) CurrentCABundleContent() []byte {
	c := p.cur.Load()
	if c == nil {
		return nil
	}
	return c.bundle
}

// VerifyOptions returns options that verify client certificates against the
// current bundle (Roots) for client auth, and false before the first
// successful load.
func (p *FileCA) VerifyOptions() (x509.VerifyOptions, bool) {
	c := p.cur.Load()
	if c == nil {
		return x509.VerifyOptions{}, false
	}
	return c.opts, true
}

// Certificates returns the parsed CAs of the current bundle, or nil before
// the first successful load. They must not be modified.
func (p *FileCA) Certificates() []*x509.Certificate {
	c := p.cur.Load()
	if c == nil {
		return nil
	}
	return c.certs
}

// LastError returns the error of the last reported load, or nil if it
// succeeded. A failure that a change in progress resolves within the grace
// period is not reported.
func (p *FileCA) LastError() error { return p.src.report.lastError() }

// RunOnce loads the file once, synchronously. It returns the load error,
// which names the file, if the content on disk is not valid; the provider
// then keeps its previous bundle (if any) and stays usable.
func (p *FileCA) RunOnce(context.Context) error { return p.load() }

// Run loads the file and keeps reloading it on change until ctx is done.
// workers is ignored: there is one loop.
func (p *FileCA) Run(ctx context.Context, _ int) {
	p.src.run(ctx, p.tryLoad)
}

// load is tryLoad with its failure reported.
func (p *FileCA) load() error { return p.src.reported(p.tryLoad()) }

// tryLoad reads and parses the bundle and, if it changed, serves it and
// notifies the listeners. It returns a failure without reporting it: the
// caller decides whether it is reported.
func (p *FileCA) tryLoad() error {
	p.src.loadMu.Lock()
	defer p.src.loadMu.Unlock()

	bundle, err := readPEMFile(p.src.paths[0])
	if err != nil {
		return p.wrap(err)
	}
	prev := p.cur.Load()
	if prev != nil && bytes.Equal(prev.bundle, bundle) {
		if p.src.report.succeeded() {
			klog.Background().Info("Content is valid again, serving the same CA bundle", "provider", p.src.name)
		}
		return nil
	}
	pool, certs, err := pki.NewPool(bundle)
	if err != nil {
		return p.wrap(certreport.WithContent(err, bundle))
	}
	p.cur.Store(&caContent{
		bundle: bundle,
		certs:  certs,
		opts:   clientVerifyOptions(pool),
	})
	p.src.report.succeeded()
	p.src.report.BundleLoaded(certs, "file", p.file)
	p.notify()
	return nil
}

func (p *FileCA) wrap(err error) error {
	return fmt.Errorf("loading CA bundle %s: %w", p.file, err)
}
