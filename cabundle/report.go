package cabundle

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// This file holds the reports about contested objects that go beyond the
// metric: log lines and Events on the object.

// Event reasons and the action of every Event.
const (
	reasonContested   = "CABundleContested"
	reasonForced      = "CABundleForced"
	reasonUncontested = "CABundleUncontested"
	eventAction       = "PublishCABundle"
)

// reportContested logs, and sends an Event, that v became contested.
func (p *Publisher) reportContested(a *kindAdapter, v objectView, g contestView) {
	other := orUnknown(g.manager)
	if p.ssa {
		p.logger.Error(nil, "caBundle is contested: another field manager owns it; not forcing, backing off",
			"kind", a.kind, "name", v.name, "otherWriter", other, "cause", g.cause, "forceIn", g.wait)
		p.event(a, v, corev1.EventTypeWarning, reasonContested,
			"caBundle is contested: %s (manager %s); not forcing: will apply with force in %v, backing off while it keeps changing",
			g.cause, other, g.wait.Round(time.Second))
		return
	}
	p.logger.Error(nil, "caBundle is contested: another writer keeps changing it; backing off",
		"kind", a.kind, "name", v.name, "otherWriter", other, "cause", g.cause, "nextWriteIn", g.wait)
	p.event(a, v, corev1.EventTypeWarning, reasonContested,
		"caBundle is contested: %s (last by %s); backing off, next write in %v. Remove the other writer of this caBundle",
		g.cause, other, g.wait.Round(time.Second))
}

// reportForced logs, and sends an Event, that a contested caBundle is about
// to be taken over with a forced server-side apply.
func (p *Publisher) reportForced(a *kindAdapter, v objectView, g contestView) {
	other := orUnknown(g.manager)
	p.logger.Info("Taking a contested caBundle over with a forced server-side apply after backing off",
		"kind", a.kind, "name", v.name, "otherWriter", other, "contestedSince", g.since)
	p.event(a, v, corev1.EventTypeWarning, reasonForced,
		"taking caBundle over from %s with a forced server-side apply after backing off (contested for %v)",
		other, p.clock.Since(g.since).Round(time.Second))
}

// reportUncontested logs, and sends an Event, that v is no longer
// contested.
func (p *Publisher) reportUncontested(a *kindAdapter, v objectView, g contestView) {
	took := p.clock.Since(g.since).Round(time.Second)
	p.logger.Info("caBundle no longer contested: the published bundle stuck", "kind", a.kind, "name", v.name, "contestedFor", took)
	p.event(a, v, corev1.EventTypeNormal, reasonUncontested,
		"caBundle no longer contested after %v: the published bundle stuck", took)
}

// event sends an Event about v when a recorder is configured. The object is
// given as a reference, so the recorder's scheme need not know its kind.
func (p *Publisher) event(a *kindAdapter, v objectView, eventtype, reason, note string, args ...any) {
	if p.recorder == nil {
		return
	}
	ref := &corev1.ObjectReference{APIVersion: a.apiVersion, Kind: string(a.kind), Name: v.name, UID: v.uid}
	p.recorder.Eventf(ref, nil, eventtype, reason, eventAction, note, args...)
}
