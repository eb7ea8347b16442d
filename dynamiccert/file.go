package dynamiccert

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/pki"
)

// FileCertKeyConfig configures a FileCertKey.
type FileCertKeyConfig struct {
	// Name identifies the provider in logs and metrics. Default
	// "file:<CertFile>".
	Name string
	// CertFile and KeyFile are the PEM certificate chain (the leaf, then
	// each certificate's issuer in turn) and the private key. Both are
	// required. They may name the same file, which then holds the key and
	// the chain in either order: the kubelet's podCertificate projected
	// volume writes its credentialBundlePath that way (a PKCS#8 key, then
	// the chain), and kube-apiserver accepts one file for
	// --tls-cert-file and --tls-private-key-file as well. Neither file has to
	// exist when the provider is created.
	CertFile, KeyFile string
	// SNINames are explicit names to serve the certificate for, returned by
	// SNINames. Nil means the names come from the certificate.
	SNINames []string
	// ResyncInterval is how often the files are re-read even without a
	// filesystem event: a safety net for missed events and for filesystems
	// (NFS, FUSE) that send none. Default DefaultFileResyncInterval.
	ResyncInterval time.Duration
	// Clock drives the resync ticker and the validity check (NotBefore,
	// NotAfter) of loaded certificates. Default clock.RealClock{}.
	Clock clock.WithTicker
	// EventRecorder, with EventObject (the object the Events are about,
	// e.g. the Pod), receives a Normal CertificateRotated Event for every
	// new certificate and a Warning CertificateLoadFailed Event for every
	// distinct load failure. Optional: no Events without both.
	EventRecorder events.EventRecorder
	EventObject   runtime.Object
}

// FileCertKey serves a certificate and key read from two files, and reloads
// them when they change. It watches the files' parent directories, so it
// follows in-place rewrites, rename-over, delete-then-create and the
// kubelet's ..data symlink swap alike, and it re-reads them every
// ResyncInterval as well.
//
// New content replaces the served content only if it parses, the key
// matches, the leaf is valid now and usable for server auth, and the chain
// is in order (pki.ErrBrokenChain). The whole chain is served, so clients
// that trust only the root verify it. Otherwise the
// last good pair keeps being served, the error is counted in
// evercert_certificate_load_errors_total and logged once per distinct error.
// A half-written pair (new certificate, old key) is therefore rejected, and
// taken as soon as the matching key arrives. Content whose bytes did not
// change is not parsed again: nothing is logged or notified, and a served
// certificate that expires keeps being served (there is nothing better; the
// expiration metric shows it). Files are read up to pki.MaxPEMSize+1 bytes,
// and anything but a regular file (a directory, a FIFO) is refused without
// blocking.
//
// The files are read as soon as a filesystem event arrives, so a complete
// new pair is served within milliseconds of its last write. Content that is
// not valid yet (the certificate written, the key not yet; a file truncated
// and not yet rewritten) is re-read on every further event and with a short
// real-time backoff, and the failure is reported (counted, logged, returned
// by LastError) only if it is still there a quarter of a second after the
// change began; failures seen by RunOnce and by the resync are reported at
// once. A directory that does not exist yet, or was deleted, is watched
// again as soon as it (re)appears, checked with a short real-time backoff
// and on every resync tick.
//
// FileCertKey implements dynamiccertificates.CertKeyContentProvider,
// SNICertKeyContentProvider, Notifier and ControllerRunner. It is safe for
// concurrent use.
type FileCertKey struct {
	listeners
	src               *fileSource
	certFile, keyFile string
	// oneFile is set when CertFile and KeyFile are the same file: it is
	// read once per load and split into chain and key (src.paths has one
	// entry).
	oneFile  bool
	sniNames []string

	cur atomic.Pointer[certKeyContent]
}

var (
	_ dynamiccertificates.CertKeyContentProvider    = &FileCertKey{}
	_ dynamiccertificates.SNICertKeyContentProvider = &FileCertKey{}
	_ dynamiccertificates.Notifier                  = &FileCertKey{}
	_ dynamiccertificates.ControllerRunner          = &FileCertKey{}
)

// NewFileCertKey validates cfg and returns a provider that has no content
// yet. Call RunOnce to load the files now, and Run to keep them loaded.
func NewFileCertKey(cfg FileCertKeyConfig) (*FileCertKey, error) {
	switch {
	case cfg.CertFile == "":
		return nil, errors.New("file certificate provider: missing certificate file")
	case cfg.KeyFile == "":
		return nil, errors.New("file certificate provider: missing key file")
	}
	name := cfg.Name
	if name == "" {
		name = "file:" + cfg.CertFile
	}
	src, err := newFileSource(name, newReporter(name, cfg.EventRecorder, cfg.EventObject), cfg.ResyncInterval, cfg.Clock, cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	oneFile := src.paths[0] == src.paths[1]
	if oneFile {
		src.paths = src.paths[:1]
	}
	return &FileCertKey{
		src:      src,
		certFile: cfg.CertFile,
		keyFile:  cfg.KeyFile,
		oneFile:  oneFile,
		sniNames: slices.Clone(cfg.SNINames),
	}, nil
}

// Name returns the provider's name.
func (p *FileCertKey) Name() string { return p.src.name }

// CurrentCertKeyContent returns the PEM certificate chain and key last
// loaded successfully, or nil, nil before the first successful load. When
// the key and chain share one file, they are returned apart (re-encoded PEM
// blocks), as every consumer of the interface expects.
func (p *FileCertKey) CurrentCertKeyContent() ([]byte, []byte) {
	c := p.cur.Load()
	if c == nil {
		return nil, nil
	}
	return c.cert, c.key
}

// SNINames returns the explicit SNI names from the config, or nil when the
// names are to be taken from the certificate.
func (p *FileCertKey) SNINames() []string { return p.sniNames }

// CurrentParsedCertKeyContent returns what CurrentCertKeyContent returns
// together with the certificate parsed from it (Leaf set), or nil, nil, nil
// before the first successful load. The sni controller serves that
// certificate as is, instead of parsing the PEM again. None of it may be
// modified.
func (p *FileCertKey) CurrentParsedCertKeyContent() ([]byte, []byte, *tls.Certificate) {
	return p.cur.Load().parsed()
}

// current returns the parsed pair last loaded successfully, or nil before
// the first successful load. It must not be modified.
func (p *FileCertKey) current() *pki.KeyPair {
	c := p.cur.Load()
	if c == nil {
		return nil
	}
	return c.pair
}

// LastError returns the error of the last reported load, or nil if it
// succeeded. A failure that a change in progress resolves within the grace
// period is not reported.
func (p *FileCertKey) LastError() error { return p.src.report.lastError() }

// RunOnce loads the files once, synchronously. It returns the load error,
// which names the files, if the content on disk is not valid; the provider
// then keeps its previous content (if any) and stays usable.
func (p *FileCertKey) RunOnce(context.Context) error { return p.load() }

// Run loads the files and keeps reloading them on change until ctx is done.
// workers is ignored: there is one loop.
func (p *FileCertKey) Run(ctx context.Context, _ int) {
	p.src.run(ctx, p.tryLoad)
}

// load is tryLoad with its failure reported.
func (p *FileCertKey) load() error { return p.src.reported(p.tryLoad()) }

// tryLoad reads and validates the files and, if the pair changed, serves it
// and notifies the listeners. It returns a failure without reporting it:
// the caller decides whether it is reported.
func (p *FileCertKey) tryLoad() error {
	p.src.loadMu.Lock()
	defer p.src.loadMu.Unlock()

	certPEM, keyPEM, err := p.read()
	if err != nil {
		return p.wrap(err)
	}
	changed, err := storeCertKey(&p.cur, p.src.report, certPEM, keyPEM, p.src.clock.Now(), "files", p.certFile+","+p.keyFile)
	if err != nil {
		return p.wrap(err)
	}
	if changed {
		p.notify()
	}
	return nil
}

// read returns the chain and key PEM from the files, or from the one file
// split in two.
func (p *FileCertKey) read() (certPEM, keyPEM []byte, err error) {
	if p.oneFile {
		data, err := readPEMFile(p.src.paths[0])
		if err != nil {
			return nil, nil, err
		}
		certPEM, keyPEM, err := pki.SplitCertKey(data)
		if err != nil {
			// Marked with the file's content, as storeCertKey marks a
			// pair that does not parse: another bad file with the same
			// message is another failure, a re-read of this one is not.
			return nil, nil, certreport.WithContent(err, data)
		}
		return certPEM, keyPEM, nil
	}
	if certPEM, err = readPEMFile(p.src.paths[0]); err != nil {
		return nil, nil, err
	}
	if keyPEM, err = readPEMFile(p.src.paths[1]); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

func (p *FileCertKey) wrap(err error) error {
	if p.oneFile {
		return fmt.Errorf("loading certificate and key from %s: %w", p.certFile, err)
	}
	return fmt.Errorf("loading certificate %s and key %s: %w", p.certFile, p.keyFile, err)
}
