package sni

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/pki"
)

// The parse cache keeps, per provider, the last content that parsed and its
// result, and the last content that was rejected and why. It exists so that
// a rebuild after one of many providers changed parses, logs and counts only
// that provider: upstream re-parses and re-logs every certificate on every
// change.
//
// Slots are owned by the controller and only touched under its syncMu
// (certSlot.queued excepted).

// certSlot caches one certificate provider (the serving one or an SNI one).
type certSlot struct {
	provider dynamiccertificates.CertKeyContentProvider
	// sni is the same provider as an SNI provider, or nil for the serving
	// slot; only SNI slots contribute names to the index.
	sni  dynamiccertificates.SNICertKeyContentProvider
	role string
	// nameOnly is set for a NameOnlyProvider: the slot is never the default
	// and claims only its explicit, non-IP names (see NameOnlyProvider).
	nameOnly bool
	// name is the provider's Name() as of the last refresh.
	name string

	// The last good content, its parse result and the names taken from it.
	// pair is nil until the provider has had valid content once.
	cert, key []byte
	pair      *pki.KeyPair
	extracted []string
	// desc describes pair for Served; made once per parse because it is
	// shared by every snapshot that serves pair, and never modified.
	desc *ServedCertificate
	// explicit holds the lower-cased, de-duplicated SNINames() of the last
	// refresh; explicitSeen is the list as the provider returned it
	// (lower-cased), to detect changes without allocating.
	explicit     []string
	explicitSeen []string

	// The last rejected content and the error it got; badErr is nil when
	// the current content is the good one.
	badCert, badKey []byte
	badErr          error

	// What the current snapshot holds of this slot, so that a rebuild after
	// content changes can derive the next snapshot from it (see
	// deriveSnapshot). inSnapshot is the pair it serves (nil if none) and
	// servedIndex its entry in snapshot.served; reindex is set when the
	// slot's names, or whether it has a certificate at all, changed since
	// the last full build, which then must rebuild the name index.
	inSnapshot  *pki.KeyPair
	servedIndex int
	reindex     bool

	// queued is set while the slot is in the controller's dirty list;
	// guarded by the controller's dirtyMu, not syncMu.
	queued bool
}

// refreshResult tells the controller what one slot refresh did.
type refreshResult struct {
	// changed is true when the slot's contribution to the snapshot (its
	// certificate or its explicit names) is different from before.
	changed bool
	// err is the rejection of the provider's current content, wrapped with
	// the provider's name; the slot keeps its last good certificate.
	err error
	// retry is true when the rejection may go away without a content change
	// (a certificate that is not valid yet), so the sync should be retried.
	retry bool
}

// refresh reads the provider's current content and brings the slot up to
// date. Content identical to the last good or the last rejected content is
// not parsed again; a rejected certificate that is merely not valid yet is
// the exception, since time alone can make it valid.
func (s *certSlot) refresh(c *DynamicServingCertificateController, now time.Time) refreshResult {
	s.name = s.provider.Name()
	certPEM, keyPEM := s.provider.CurrentCertKeyContent()

	var res refreshResult
	if s.sni != nil {
		if names := s.sni.SNINames(); !equalFoldNames(s.explicitSeen, names) {
			s.explicitSeen = lowerNames(names, false)
			s.explicit = lowerNames(names, true)
			if s.nameOnly {
				s.explicit = withoutIPs(s.explicit)
			}
			res.changed = true
			s.reindex = true
		}
	}

	if s.pair != nil && sameBytes(certPEM, s.cert) && sameBytes(keyPEM, s.key) {
		// Unchanged, or back to the last good content after a rejection.
		s.badCert, s.badKey, s.badErr = nil, nil, nil
		return res
	}
	sameAsBad := s.badErr != nil && sameBytes(certPEM, s.badCert) && sameBytes(keyPEM, s.badKey)
	if sameAsBad && !errors.Is(s.badErr, pki.ErrNotYetValid) {
		// Already counted and logged.
		res.err = s.badErr
		return res
	}

	if c.onParse != nil {
		c.onParse(s.name)
	}
	pair, err := pki.ParseCertKey(certPEM, keyPEM, now)
	if err != nil {
		err = fmt.Errorf("%s certificate from provider %q rejected: %w", s.role, s.name, err)
		if !sameAsBad {
			// Count each distinct bad content once, not each retry of it.
			certmetrics.LoadError(s.name)
		}
		if s.badErr == nil || s.badErr.Error() != err.Error() {
			// pki errors carry the subject and validity at most, never key
			// material or PEM, so the error is safe to log as is.
			klog.ErrorS(err, "Rejected new certificate content", "controller", c.opts.name,
				"provider", s.name, "role", s.role, "keepingLastGood", s.pair != nil)
		}
		s.badCert, s.badKey, s.badErr = certPEM, keyPEM, err
		res.err = err
		res.retry = errors.Is(err, pki.ErrNotYetValid)
		return res
	}

	rotated := s.pair != nil
	extracted := extractNames(pair.Leaf)
	if !rotated || !slices.Equal(extracted, s.extracted) {
		s.reindex = true
	}
	s.cert, s.key, s.pair = certPEM, keyPEM, pair
	s.extracted = extracted
	desc := describe(s.name, s.role, pair.Leaf)
	s.desc = &desc
	s.badCert, s.badKey, s.badErr = nil, nil, nil
	res.changed = true

	certmetrics.CertificateLoaded(s.name, pair.Leaf.SerialNumber.Text(16), pair.Leaf.NotAfter)
	if logger := klog.V(2); logger.Enabled() {
		names := s.explicit
		if len(names) == 0 {
			names = s.extracted
		}
		logger.InfoS("Loaded certificate", "controller", c.opts.name, "provider", s.name, "role", s.role,
			"subject", pair.Leaf.Subject.CommonName, "names", names,
			"notAfter", pair.Leaf.NotAfter, "serial", pair.Leaf.SerialNumber.Text(16), "rotated", rotated)
	}
	return res
}

// names returns the names the slot claims in the SNI index and whether they
// were given explicitly.
func (s *certSlot) names() ([]string, bool) {
	if len(s.explicit) > 0 || s.nameOnly {
		return s.explicit, true
	}
	return s.extracted, false
}

// caSlot caches the client CA provider.
type caSlot struct {
	provider dynamiccertificates.CAContentProvider
	name     string

	// loaded is true once a bundle was accepted; pool and certs are the
	// last good bundle's.
	loaded bool
	bundle []byte
	pool   *x509.CertPool
	certs  []*x509.Certificate
	// descs describe certs for Served; shared with snapshots, never
	// modified.
	descs []ServedCertificate

	badBundle []byte
	badErr    error
}

// refresh reads the provider's current bundle. An empty bundle is accepted
// and means "no client CA": as upstream notes, the server stays secure, and
// with an empty pool any presented client certificate is rejected. An
// invalid bundle is counted and logged once and the last good pool is kept.
func (s *caSlot) refresh(c *DynamicServingCertificateController) refreshResult {
	s.name = s.provider.Name()
	bundle := s.provider.CurrentCABundleContent()

	if s.loaded && sameBytes(bundle, s.bundle) {
		s.badBundle, s.badErr = nil, nil
		return refreshResult{}
	}
	if s.badErr != nil && sameBytes(bundle, s.badBundle) {
		return refreshResult{err: s.badErr}
	}

	var (
		pool  *x509.CertPool
		certs []*x509.Certificate
		err   error
	)
	if c.onParse != nil {
		c.onParse(s.name)
	}
	if len(bytes.TrimSpace(bundle)) == 0 {
		pool = x509.NewCertPool()
	} else if pool, certs, err = pki.NewPool(bundle); err != nil {
		err = fmt.Errorf("client CA bundle from provider %q rejected: %w", s.name, err)
		certmetrics.LoadError(s.name)
		if s.badErr == nil || s.badErr.Error() != err.Error() {
			klog.ErrorS(err, "Rejected new client CA bundle", "controller", c.opts.name,
				"provider", s.name, "keepingLastGood", s.loaded)
		}
		s.badBundle, s.badErr = bundle, err
		return refreshResult{err: err}
	}

	s.loaded, s.bundle, s.pool, s.certs = true, bundle, pool, certs
	s.descs = make([]ServedCertificate, len(certs))
	for i, cert := range certs {
		s.descs[i] = describe(s.name, RoleClientCA, cert)
	}
	s.badBundle, s.badErr = nil, nil
	if logger := klog.V(2); logger.Enabled() {
		subjects := make([]string, len(certs))
		for i, cert := range certs {
			subjects[i] = cert.Subject.CommonName
		}
		logger.InfoS("Loaded client CA bundle", "controller", c.opts.name, "provider", s.name,
			"count", len(certs), "subjects", subjects)
	}
	return refreshResult{changed: true}
}

// sameBytes reports whether a and b hold the same content. Providers hand
// out the same slice until their content changes, so comparing the backing
// array and length almost always answers without reading the bytes.
// Providers must therefore never modify a slice they returned, which the
// dynamiccertificates contract already implies.
func sameBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	return bytes.Equal(a, b)
}

// extractNames returns the SNI names a certificate is selected for when its
// provider gives none explicitly: the CN when it is a DNS name (or
// wildcard), then the DNS SANs, lower-cased. IP SANs and an IP CN are left
// out, as upstream does: SNI never carries an IP, and indexing one would let
// the no-SNI local-address fallback pick the certificate unexpectedly.
func extractNames(leaf *x509.Certificate) []string {
	names := make([]string, 0, 1+len(leaf.DNSNames))
	cn := strings.ToLower(leaf.Subject.CommonName)
	if _, err := netip.ParseAddr(cn); err != nil && cn != "" &&
		(cn == "*" || len(validation.IsDNS1123Subdomain(cn)) == 0 || len(validation.IsWildcardDNS1123Subdomain(cn)) == 0) {
		names = append(names, cn)
	}
	for _, name := range leaf.DNSNames {
		names = appendUnique(names, strings.ToLower(name))
	}
	return names
}

// equalFoldNames reports whether lowered (already lower-case) equals names
// ignoring case, without allocating.
func equalFoldNames(lowered, names []string) bool {
	if len(lowered) != len(names) {
		return false
	}
	for i := range names {
		if lowered[i] != names[i] && !strings.EqualFold(lowered[i], names[i]) {
			return false
		}
	}
	return true
}

// lowerNames returns a lower-cased copy of names, optionally without
// duplicates, so the slot never aliases a slice the provider owns.
func lowerNames(names []string, unique bool) []string {
	if len(names) == 0 {
		return nil
	}
	out := make([]string, 0, len(names))
	for _, name := range names {
		if unique {
			out = appendUnique(out, strings.ToLower(name))
		} else {
			out = append(out, strings.ToLower(name))
		}
	}
	return out
}

// appendUnique appends name unless names has it already: a name listed
// twice (commonly the CN repeated as a SAN) is claimed once. Name lists are
// short, so a linear scan beats a map.
func appendUnique(names []string, name string) []string {
	if slices.Contains(names, name) {
		return names
	}
	return append(names, name)
}
