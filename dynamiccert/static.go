package dynamiccert

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/evercert/evercert/internal/pki"
)

// StaticCertKey serves fixed certificate and key content. It never changes,
// so AddListener is a no-op. It is safe for concurrent use.
type StaticCertKey struct {
	name     string
	certPEM  []byte
	keyPEM   []byte
	sniNames []string
	pair     *pki.KeyPair
}

var (
	_ dynamiccertificates.CertKeyContentProvider    = &StaticCertKey{}
	_ dynamiccertificates.SNICertKeyContentProvider = &StaticCertKey{}
)

// StaticCertKeyConfig configures a StaticCertKey.
type StaticCertKeyConfig struct {
	// Name identifies the provider in logs, metrics and Events. Required.
	Name string
	// Cert is the PEM certificate chain, leaf first. Required.
	Cert []byte
	// Key is the PEM private key matching Cert. Required.
	Key []byte
	// SNINames, when set, replace the names taken from the certificate for
	// SNI selection. Default none.
	SNINames []string
}

// NewStaticCertKey validates cfg.Cert and cfg.Key (structure, chain order,
// and that the key matches the certificate; validity dates are checked by
// whoever serves it, against its own clock) and returns a provider for them.
// It copies what it keeps.
func NewStaticCertKey(cfg StaticCertKeyConfig) (*StaticCertKey, error) {
	if cfg.Name == "" {
		return nil, errors.New("StaticCertKeyConfig.Name is required")
	}
	pair, err := pki.ParseCertKey(cfg.Cert, cfg.Key, zeroTime)
	if err != nil {
		return nil, fmt.Errorf("loading static certificate %q (StaticCertKeyConfig.Cert, .Key): %w", cfg.Name, err)
	}
	// The provider parsed it, so it reports it: the sni controller serving
	// it does not.
	newReporter(cfg.Name, nil, nil).Loaded(pair.Leaf, "source", "static")
	return &StaticCertKey{
		name:     cfg.Name,
		certPEM:  bytes.Clone(cfg.Cert),
		keyPEM:   bytes.Clone(cfg.Key),
		sniNames: append([]string(nil), cfg.SNINames...),
		pair:     pair,
	}, nil
}

// Name returns the provider name given to NewStaticCertKey.
func (s *StaticCertKey) Name() string { return s.name }

// CurrentCertKeyContent returns the certificate and key PEM. Callers must not
// modify the returned slices.
func (s *StaticCertKey) CurrentCertKeyContent() ([]byte, []byte) { return s.certPEM, s.keyPEM }

// SNINames returns the explicit SNI names, or nil.
func (s *StaticCertKey) SNINames() []string { return s.sniNames }

// CurrentParsedCertKeyContent returns the certificate and key PEM together
// with the certificate parsed from them. The sni controller serves it as is,
// without parsing the PEM again. None of it may be modified.
func (s *StaticCertKey) CurrentParsedCertKeyContent() ([]byte, []byte, *tls.Certificate) {
	return s.certPEM, s.keyPEM, &s.pair.TLS
}

// AddListener does nothing: static content never changes.
func (s *StaticCertKey) AddListener(dynamiccertificates.Listener) {}

// StaticCA serves a fixed CA bundle. It is safe for concurrent use.
type StaticCA struct {
	name   string
	bundle []byte
	opts   x509.VerifyOptions
}

var _ dynamiccertificates.CAContentProvider = &StaticCA{}

// NewStaticCA validates bundle (one or more PEM CERTIFICATE blocks, nothing
// else) and returns a provider for it.
func NewStaticCA(name string, bundle []byte) (*StaticCA, error) {
	pool, _, err := pki.NewPool(bundle)
	if err != nil {
		return nil, fmt.Errorf("loading static CA bundle %q: %w", name, err)
	}
	return &StaticCA{name: name, bundle: bytes.Clone(bundle), opts: clientVerifyOptions(pool)}, nil
}

// Name returns the provider name given to NewStaticCA.
func (s *StaticCA) Name() string { return s.name }

// CurrentCABundleContent returns the bundle PEM. Callers must not modify it.
func (s *StaticCA) CurrentCABundleContent() []byte { return s.bundle }

// VerifyOptions returns options that verify client certificates against the
// bundle.
func (s *StaticCA) VerifyOptions() (x509.VerifyOptions, bool) { return s.opts, true }

// AddListener does nothing: static content never changes.
func (s *StaticCA) AddListener(dynamiccertificates.Listener) {}
