package sni

import (
	"bytes"
	"crypto/tls"
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

	"github.com/evercert/evercert/internal/certreport"
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
	sni dynamiccertificates.SNICertKeyContentProvider
	// parsed is the same provider when it hands out its content parsed
	// (ParsedCertKeyProvider), or nil: the controller then parses it.
	parsed ParsedCertKeyProvider
	role   string
	// nameOnly is set for a NameOnlyProvider: the slot is never the default
	// and claims only its explicit, non-IP names (see NameOnlyProvider).
	nameOnly bool
	// owner is, for a name-only slot, the slot of the name-only provider
	// (itself, or the provider whose alternative it is), so that the
	// provider's alternatives join its names and nobody else does; nil
	// otherwise.
	owner *certSlot
	// name is the provider's Name() as of the last refresh.
	name string
	// report reports what the controller parses and what it rejects.
	report *certreport.Reporter

	// The last good content, its parse result and the names taken from it.
	// pair is nil until the provider has had valid content once.
	cert, key []byte
	pair      *pki.KeyPair
	extracted []string
	// desc describes pair for Served; made once per parse because it is
	// shared by every snapshot that serves pair, and never modified.
	desc *ServedCertificate
	// single is pair alone as an index entry, made once per parse and
	// shared by every name and snapshot that selects only pair.
	single *choice
	// sans is pair's subject alternative names (DNS names and IPs),
	// canonical and sorted, to find the default's alternatives: empty
	// without SANs. ipSANs are its IP SANs, which a serving certificate
	// joins in the IP index.
	sans   string
	ipSANs []string
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

	// aggregated is set when the slot's metrics are reported with those of
	// other slots (see aggregateMetrics); set at construction.
	aggregated bool

	// queued is set while the slot is in the controller's dirty list;
	// guarded by the controller's dirtyMu, not syncMu.
	queued bool
}

// newCertSlot returns the slot of provider p in role; sni is p as an SNI
// provider, or nil for the serving slot.
func newCertSlot(o options, p dynamiccertificates.CertKeyContentProvider, sni dynamiccertificates.SNICertKeyContentProvider, role string) *certSlot {
	s := &certSlot{provider: p, sni: sni, role: role, name: p.Name(),
		report: certreport.New(p.Name(), o.eventRecorder, o.eventObject)}
	s.parsed, _ = p.(ParsedCertKeyProvider)
	if sni != nil && isNameOnly(sni) {
		s.nameOnly, s.owner = true, s
	}
	return s
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
// not looked at again; a rejected certificate that is merely not valid yet
// is the exception, since time alone can make it valid.
//
// New content of a ParsedCertKeyProvider is taken as the provider parsed it,
// which reported it; other content is parsed here, and reported here (one
// log line, the metrics, an Event on rotation). A rejection is reported here
// either way, once per distinct failure.
//
// refresh is fetch then apply; a sync that reads every provider runs the
// fetches of many slots at once (fetchAll) and then applies them in order.
func (s *certSlot) refresh(c *DynamicServingCertificateController, now time.Time) refreshResult {
	return s.apply(c, s.fetch(c, now))
}

// fetched is what fetch read from a slot's provider and, for new content,
// what it made of it.
type fetched struct {
	name            string
	certPEM, keyPEM []byte
	parsed          *tls.Certificate
	sniNames        []string // the SNI provider's SNINames(), as returned

	// skip is why the content is not loaded, or skipNone when it was:
	// then err is its rejection, or pair and the rest its result.
	skip      skipReason
	err       error
	pair      *pki.KeyPair
	extracted []string
	sans      string
	ipSANs    []string
	desc      *ServedCertificate
}

// skipReason tells why fetch did not load a provider's content.
type skipReason int

const (
	skipNone      skipReason = iota
	skipUnchanged            // the last good content
	skipNotLoaded            // a ParsedCertKeyProvider with nothing loaded yet
	skipSameAsBad            // the last rejected content, already reported
)

// skip returns why content read from the provider need not be loaded, from
// the slot's cache; fetch and apply ask it with the same slot state, so they
// agree.
func (s *certSlot) skip(certPEM, keyPEM []byte, parsed *tls.Certificate) skipReason {
	switch {
	case s.pair != nil && sameBytes(certPEM, s.cert) && sameBytes(keyPEM, s.key):
		// Unchanged, or back to the last good content after a rejection.
		return skipUnchanged
	case s.parsed != nil && parsed == nil:
		return skipNotLoaded
	case s.badErr != nil && sameBytes(certPEM, s.badCert) && sameBytes(keyPEM, s.badKey) &&
		!errors.Is(s.badErr, pki.ErrNotYetValid):
		return skipSameAsBad
	}
	return skipNone
}

// fetch reads the provider and, when its content is new, parses it (or,
// for a ParsedCertKeyProvider, checks its dates) and derives what the slot
// keeps of it. It only reads the slot, reports nothing and changes nothing
// shared, so the fetches of different slots may run concurrently while the
// controller's syncMu is held; apply then updates the slot.
func (s *certSlot) fetch(c *DynamicServingCertificateController, now time.Time) fetched {
	f := fetched{name: s.provider.Name()}
	if s.parsed != nil {
		f.certPEM, f.keyPEM, f.parsed = s.parsed.CurrentParsedCertKeyContent()
	} else {
		f.certPEM, f.keyPEM = s.provider.CurrentCertKeyContent()
	}
	if s.sni != nil {
		f.sniNames = s.sni.SNINames()
	}
	if f.skip = s.skip(f.certPEM, f.keyPEM, f.parsed); f.skip != skipNone {
		return f
	}
	f.pair, f.err = s.load(c, f.name, f.certPEM, f.keyPEM, f.parsed, now)
	if f.err != nil {
		return f
	}
	f.extracted = extractNames(f.pair.Leaf)
	f.sans, f.ipSANs = subjectAltNames(f.pair.Leaf)
	desc := describe(f.name, s.role, f.pair.Leaf)
	f.desc = &desc
	return f
}

// apply brings the slot up to date with what fetch read, reporting what
// changed; see refresh.
func (s *certSlot) apply(c *DynamicServingCertificateController, f fetched) refreshResult {
	s.name = f.name
	var res refreshResult
	if s.sni != nil {
		if names := f.sniNames; !equalFoldNames(s.explicitSeen, names) {
			s.explicitSeen = lowerNames(names, false)
			s.explicit = lowerNames(names, true)
			if s.nameOnly {
				s.explicit = withoutIPs(s.explicit)
			}
			res.changed = true
			s.reindex = true
		}
	}

	switch f.skip {
	case skipUnchanged:
		s.badCert, s.badKey, s.badErr = nil, nil, nil
		s.report.Succeeded()
		return res
	case skipNotLoaded:
		// Nothing loaded yet: the provider reports its own failures.
		res.err = fmt.Errorf("%s certificate from provider %q: nothing loaded yet", s.role, s.name)
		return res
	case skipSameAsBad:
		// Already reported.
		res.err = s.badErr
		return res
	}

	if f.err != nil {
		err := fmt.Errorf("%s certificate from provider %q rejected: %w", s.role, s.name, f.err)
		// Reported once per distinct error and content, however often it
		// is retried. pki errors carry the subject and validity at most,
		// never key material or PEM, so the error is safe to log as is.
		s.report.Failed(certreport.WithContent(err, f.certPEM, f.keyPEM), "controller", c.opts.name,
			"role", s.role, "keepingLastGood", s.pair != nil)
		s.badCert, s.badKey, s.badErr = f.certPEM, f.keyPEM, err
		res.err = err
		res.retry = errors.Is(err, pki.ErrNotYetValid)
		return res
	}

	// A derived snapshot (deriveSnapshot) replaces this slot's certificate
	// where the old one is, so everything that decided where it is must be
	// as before: the names it claims, the SANs it is joined by, and its key
	// algorithm, which decides which certificates it joins and where.
	pair := f.pair
	rotated := s.pair != nil
	if !rotated || !slices.Equal(f.extracted, s.extracted) || f.sans != s.sans ||
		!slices.Equal(f.ipSANs, s.ipSANs) || keyRank(&pair.TLS) != keyRank(&s.pair.TLS) {
		s.reindex = true
	}
	s.cert, s.key, s.pair = f.certPEM, f.keyPEM, pair
	s.extracted = f.extracted
	s.sans, s.ipSANs = f.sans, f.ipSANs
	s.single = &choice{certs: []*tls.Certificate{&pair.TLS}, owner: s.owner}
	s.desc = f.desc
	s.badCert, s.badKey, s.badErr = nil, nil, nil
	s.report.Succeeded()
	res.changed = true

	if f.parsed == nil {
		// The controller parsed it, so the controller reports it.
		names, _ := s.names()
		s.report.Loaded(pair.Leaf, "controller", c.opts.name, "role", s.role, "names", names)
	}
	return res
}

// load returns the pair to serve for new content of the provider named
// name: the provider's own parse result, checked against the controller's
// clock, or the content parsed here.
func (s *certSlot) load(c *DynamicServingCertificateController, name string, certPEM, keyPEM []byte, parsed *tls.Certificate, now time.Time) (*pki.KeyPair, error) {
	if parsed != nil && parsed.Leaf != nil {
		if err := pki.CheckValidity(parsed.Leaf, now); err != nil {
			return nil, err
		}
		return &pki.KeyPair{TLS: *parsed, Leaf: parsed.Leaf}, nil
	}
	if c.onParse != nil {
		c.onParse(name)
	}
	return pki.ParseCertKey(certPEM, keyPEM, now)
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
	// report reports the bundles the controller rejects.
	report *certreport.Reporter

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
// invalid bundle is reported once per distinct bundle and error, and the
// last good pool is kept. A bundle that loads is logged at V(2) only: a
// change of bundle is reported by the provider.
func (s *caSlot) refresh(c *DynamicServingCertificateController) refreshResult {
	s.name = s.provider.Name()
	bundle := s.provider.CurrentCABundleContent()

	if s.loaded && sameBytes(bundle, s.bundle) {
		s.badBundle, s.badErr = nil, nil
		s.report.Succeeded()
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
		s.report.Failed(certreport.WithContent(err, bundle), "controller", c.opts.name, "keepingLastGood", s.loaded)
		s.badBundle, s.badErr = bundle, err
		return refreshResult{err: err}
	}

	s.loaded, s.bundle, s.pool, s.certs = true, bundle, pool, certs
	s.descs = make([]ServedCertificate, len(certs))
	for i, cert := range certs {
		s.descs[i] = describe(s.name, RoleClientCA, cert)
	}
	s.badBundle, s.badErr = nil, nil
	s.report.Succeeded()
	if logger := klog.Background().V(2); logger.Enabled() {
		subjects := make([]string, len(certs))
		for i, cert := range certs {
			subjects[i] = cert.Subject.CommonName
		}
		logger.Info("Loaded client CA bundle", "controller", c.opts.name, "provider", s.name,
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

// subjectAltNames returns leaf's DNS and IP SANs as one canonical key
// (lower-case, sorted, de-duplicated), so that two certificates for the
// same names compare equal whatever their order, and its IP SANs.
func subjectAltNames(leaf *x509.Certificate) (string, []string) {
	names := make([]string, 0, len(leaf.DNSNames)+len(leaf.IPAddresses))
	for _, name := range leaf.DNSNames {
		names = append(names, strings.ToLower(name))
	}
	var ips []string
	for _, ip := range leaf.IPAddresses {
		if addr, ok := netip.AddrFromSlice(ip); ok {
			ips = append(ips, addr.Unmap().String())
		}
	}
	names = append(names, ips...)
	slices.Sort(names)
	return strings.Join(slices.Compact(names), ","), ips
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
