package sni

import (
	"time"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certreport"
)

// aggregateMetrics switches the slots the controller reports metrics for
// (those it parses itself) to one shared series, provider=<Name>, when
// there are more of them than the options' limit (see
// ControllerConfig.PerProviderMetricsLimit), and returns them then; nil
// when each keeps its own series. Called once, at construction.
func aggregateMetrics(o options, slots []*certSlot) []*certSlot {
	var own []*certSlot
	for _, slot := range slots {
		if slot.parsed == nil {
			own = append(own, slot)
		}
	}
	if o.metricsLimit >= 0 && len(own) <= o.metricsLimit {
		return nil
	}
	for _, slot := range own {
		slot.report = certreport.NewAggregated(slot.name, o.name, o.eventRecorder, o.eventObject)
		slot.aggregated = true
	}
	return own
}

// earliestExpiry keeps the aggregated expiration gauge: the earliest
// NotAfter among the certificates the aggregated slots serve.
type earliestExpiry struct {
	slot     *certSlot // the slot that has it; nil before any has a certificate
	notAfter time.Time
}

// update takes the new certificates of the slots in changed into account
// and sets the gauge when the earliest NotAfter moved. A slot that got an
// earlier one becomes the earliest at once; only when the earliest slot
// itself got a later one (a rotation, typically) are all slots scanned
// again.
func (e *earliestExpiry) update(label string, all, changed []*certSlot) {
	prev := e.notAfter
	rescan := false
	for _, slot := range changed {
		notAfter := slot.pair.Leaf.NotAfter
		switch {
		case e.slot == nil || notAfter.Before(e.notAfter):
			e.slot, e.notAfter = slot, notAfter
		case slot == e.slot && notAfter.After(e.notAfter):
			rescan = true
		}
	}
	if rescan {
		e.slot = nil
		for _, slot := range all {
			if slot.pair != nil && (e.slot == nil || slot.pair.Leaf.NotAfter.Before(e.notAfter)) {
				e.slot, e.notAfter = slot, slot.pair.Leaf.NotAfter
			}
		}
	}
	if e.slot != nil && !e.notAfter.Equal(prev) {
		certmetrics.CertificateExpiration(label, e.notAfter)
	}
}
