package cabundle

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/pki"
)

// This file holds verification: every published field, as read back from
// the API server, must verify the chain every server serves
// (PublisherConfig.Verify). A field that does not (wiped by a Helm or
// GitOps re-apply, or missing the CA of a replica that still serves a leaf
// of a dropped CA) means clients of that server fail their handshakes: it
// is reported in evercert_cabundle_verified, the health check and a
// Warning Event, whatever the publisher then does about it.

// Event reasons of verification.
const (
	reasonUnverified = "CABundleUnverified"
	reasonVerified   = "CABundleVerified"
)

// verifyKeyPrefix prefixes the object key in Publisher.logs for the
// verification state, kept apart from the publishing state.
const verifyKeyPrefix = "verify/"

// verifications is the verification state of every object, by object key.
// It is safe for concurrent use.
type verifications struct {
	mu      sync.Mutex
	failing map[string]verifyFailure
	// published holds the objects the publisher has found holding, or
	// written, the bundle: only those are verified, so that an object
	// not published to yet (which readiness reports) is no mismatch.
	published map[string]bool
}

// markPublished records that the object key held the bundle once.
func (v *verifications) markPublished(key string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.published == nil {
		v.published = map[string]bool{}
	}
	v.published[key] = true
}

func (v *verifications) wasPublished(key string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.published[key]
}

// verifyFailure is an object whose published fields do not verify.
type verifyFailure struct {
	kind  Kind
	name  string
	since time.Time
	err   error
}

// verify checks every selected field of v (what the API server returned)
// against every served chain, at the publisher's now, and reports a
// change of the outcome: metric, log, health and Event. Without a served
// chain there is nothing to check and nothing is reported, and neither is
// an object the publisher has not published to yet.
func (p *Publisher) verify(t *targetState, v objectView) {
	if len(p.verifiers) == 0 || !p.verified.wasPublished(objectKey(t.Kind, v.name)) {
		return
	}
	chains := p.servedChains()
	if len(chains) == 0 {
		return
	}
	var fields [][]byte
	for _, s := range p.selectedSlots(t.Kind, v) {
		fields = append(fields, s.current)
	}
	if len(fields) == 0 {
		return // nothing published there, nothing to verify
	}
	err := verifyFields(fields, chains, p.clock.Now())
	key := objectKey(t.Kind, v.name)
	p.verified.mu.Lock()
	prev, wasFailing := p.verified.failing[key]
	if err != nil {
		if !wasFailing {
			prev = verifyFailure{kind: t.Kind, name: v.name, since: p.clock.Now()}
		}
		prev.err = err
		if p.verified.failing == nil {
			p.verified.failing = map[string]verifyFailure{}
		}
		p.verified.failing[key] = prev
	} else {
		delete(p.verified.failing, key)
	}
	p.verified.mu.Unlock()

	// The episode is counted before the gauge drops, so that whoever sees
	// the gauge at 0 sees the episode too.
	if err != nil && !wasFailing {
		certmetrics.CABundleUnverifiedEpisode(string(t.Kind), v.name)
	}
	certmetrics.CABundleVerified(string(t.Kind), v.name, err == nil)
	logs := p.logs.Get(verifyKeyPrefix + key)
	if err != nil {
		err = fmt.Errorf("%s: published bundle does not verify what is served: %w", key, err)
		logs.Error(p.logger, err, "Published CA bundle does not verify a served certificate: its clients fail their handshakes", "kind", t.Kind, "name", v.name)
		if !wasFailing {
			p.event(t.adapter, v, corev1.EventTypeWarning, reasonUnverified, "%v", err)
		}
		return
	}
	logs.Recovered(p.logger, "Published CA bundle verifies every served certificate again", "kind", t.Kind, "name", v.name)
	if wasFailing {
		p.event(t.adapter, v, corev1.EventTypeNormal, reasonVerified,
			"published CA bundle verifies every served certificate again, after %v", p.clock.Since(prev.since).Round(time.Second))
	}
}

// servedChains returns the chains every lister of PublisherConfig.Verify
// serves now; none without Verify.
func (p *Publisher) servedChains() []dynamiccert.ServedChain {
	var chains []dynamiccert.ServedChain
	for _, l := range p.verifiers {
		chains = append(chains, l.ServedChains()...)
	}
	return chains
}

// forgetVerification drops the state of a deleted object.
func (p *Publisher) forgetVerification(kind Kind, name string) {
	key := objectKey(kind, name)
	p.verified.mu.Lock()
	delete(p.verified.failing, key)
	delete(p.verified.published, key)
	p.verified.mu.Unlock()
	p.logs.Forget(verifyKeyPrefix + key)
	certmetrics.CABundleVerificationForgotten(string(kind), name)
}

// unverified lists the health check problems of verification, sorted.
func (p *Publisher) unverified() []string {
	p.verified.mu.Lock()
	defer p.verified.mu.Unlock()
	out := make([]string, 0, len(p.verified.failing))
	for key, f := range p.verified.failing {
		out = append(out, fmt.Sprintf("%s: published bundle does not verify what is served since %s: %v",
			key, f.since.UTC().Format(time.RFC3339), f.err))
	}
	slices.Sort(out)
	return out
}

// verifyFields checks that every field verifies every chain at now. Its
// error names the first field and server that fail, and why. No DNS name
// and any key usage are checked: the bundle's job is the trust path, the
// names are the server's concern.
func verifyFields(fields [][]byte, chains []dynamiccert.ServedChain, now time.Time) error {
	var errs []error
	for i, f := range fields {
		if len(f) == 0 {
			errs = append(errs, fmt.Errorf("field %d is empty", i))
			continue
		}
		pool, _, err := pki.NewPool(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("field %d does not parse: %w", i, err))
			continue
		}
		for _, c := range chains {
			inter := x509.NewCertPool()
			for _, ic := range c.Chain[1:] {
				inter.AddCert(ic)
			}
			_, err := c.Chain[0].Verify(x509.VerifyOptions{
				Roots: pool, Intermediates: inter, CurrentTime: now,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
			})
			if err != nil {
				errs = append(errs, fmt.Errorf("field %d does not verify the leaf %s served by %s: %w",
					i, c.Chain[0].SerialNumber.Text(16), c.Server, err))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, 0, len(errs))
	for _, e := range errs {
		msgs = append(msgs, e.Error())
	}
	slices.Sort(msgs)
	return errors.New(strings.Join(slices.Compact(msgs), "; "))
}
