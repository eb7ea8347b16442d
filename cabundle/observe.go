package cabundle

import (
	"crypto/x509"
	"slices"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
)

// This file holds observation: the publisher as a authority.Observer. What
// every target's objects hold is recorded in the informer event handler, as
// read back from the API server (what a list or watch returned, not what
// was sent), so that Observed only reads a cache.

var _ authority.TargetObserver = (*Publisher)(nil)
var _ dynamiccertificates.Notifier = (*Publisher)(nil)

// objectReadBack is what the fields one target selects in one object held
// when the informer last saw it.
type objectReadBack struct {
	// fields is the raw content of each selected field, in object order.
	fields []string
	// held is the set of fingerprints (authority.Fingerprint) of the CAs
	// that every one of the fields holds.
	held map[string]bool
}

// Name returns the publisher's name (PublisherConfig.Name, default "cabundle"), which
// is also the name of its health check.
func (p *Publisher) Name() string { return p.name }

// Targets names the publisher's targets (Target.String), e.g.
// `ValidatingWebhookConfiguration "my-hook"`: an Authority declares them in
// its CA Secret and announces them in its Lease, so that its replicas that
// do not publish wait for them too while every replica that does is down
// (authority.TargetObserver).
func (p *Publisher) Targets() []string {
	out := make([]string, len(p.targets))
	for n, t := range p.targets {
		out[n] = t.Target.String()
	}
	return out
}

// AddListener registers l to be notified (l.Enqueue) whenever what a target
// holds, as read back from the API server, changes, and when a target's
// informer has listed its objects: an issuer waiting for Observed re-checks
// at once. Listeners must not block.
func (p *Publisher) AddListener(l dynamiccertificates.Listener) { p.listeners.Add(l) }

// Observed reports whether every selected caBundle field of every object of
// every target holds ca, as read back from the API server: in the informer
// cache, that is after a list or watch returned the written object, not
// when a write succeeded. It is false until every target's informer has
// listed its objects (and so before Run). Objects that do not exist, or
// have no field to publish to (no matching webhook, conversion strategy
// None, a local APIService), do not block: a named target whose object is
// missing counts as observed. A field that holds other CAs besides ca (an
// old CA kept during a rotation, say) holds ca.
//
// Observed costs no API call and no parsing: the fingerprints held are
// computed when an event arrives. It implements authority.Observer.
func (p *Publisher) Observed(ca *x509.Certificate) bool {
	if ca == nil {
		return false
	}
	fp := authority.Fingerprint(ca)
	p.obsMu.RLock()
	defer p.obsMu.RUnlock()
	for _, t := range p.targets {
		if !t.handler.HasSynced() {
			return false
		}
		for _, rb := range t.readBack {
			if !rb.held[fp] {
				return false
			}
		}
	}
	return true
}

// Pending returns what keeps Observed(ca) false, sorted: each object that
// does not hold ca yet as "Kind/name", and each target whose informer has
// not listed its objects yet (as "Kind/name" for a named target, as the
// target's description for a selector). It is empty when Observed(ca) is
// true.
func (p *Publisher) Pending(ca *x509.Certificate) []string {
	var fp string
	if ca != nil {
		fp = authority.Fingerprint(ca)
	}
	var out []string
	p.obsMu.RLock()
	for _, t := range p.targets {
		if !t.handler.HasSynced() {
			if t.Name != "" {
				out = append(out, objectKey(t.Kind, t.Name))
			} else {
				out = append(out, t.Target.String())
			}
			continue
		}
		for name, rb := range t.readBack {
			if fp == "" || !rb.held[fp] {
				out = append(out, objectKey(t.Kind, name))
			}
		}
	}
	p.obsMu.RUnlock()
	slices.Sort(out)
	return slices.Compact(out)
}

// observe records what the object name (v nil: deleted) holds in the
// fields t selects, and notifies the listeners when that changed. It runs
// in t's event handler, which client-go never calls concurrently, so it is
// the only writer of t.readBack.
func (p *Publisher) observe(t *targetState, name string, v *objectView) {
	var fields []string
	if v != nil && t.selects(v.name, v.labels) {
		for _, s := range v.slots {
			if t.wantsService(s.service) {
				fields = append(fields, string(s.current))
			}
		}
	}
	p.obsMu.RLock()
	prev, had := t.readBack[name]
	p.obsMu.RUnlock()
	if (!had && len(fields) == 0) || (had && slices.Equal(prev.fields, fields)) {
		return
	}
	p.obsMu.Lock()
	if len(fields) == 0 {
		delete(t.readBack, name)
	} else {
		t.readBack[name] = objectReadBack{fields: fields, held: heldByAll(fields)}
	}
	p.obsMu.Unlock()
	p.listeners.Notify()
}

// heldByAll returns the fingerprints of the CAs that every PEM bundle of
// fields holds. A bundle that fails to parse holds nothing.
func heldByAll(fields []string) map[string]bool {
	parsed := make(map[string]map[string]bool, 1) // fields often repeat
	var held map[string]bool
	for i, f := range fields {
		set, ok := parsed[f]
		if !ok {
			set = make(map[string]bool)
			if certs, err := pki.ParseCABundle([]byte(f)); err == nil {
				for _, c := range certs {
					set[authority.Fingerprint(c)] = true
				}
			}
			parsed[f] = set
		}
		if i == 0 {
			held = make(map[string]bool, len(set))
			for k := range set {
				held[k] = true
			}
			continue
		}
		for k := range held {
			if !set[k] {
				delete(held, k)
			}
		}
	}
	return held
}
