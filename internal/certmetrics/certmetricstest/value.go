// Package certmetricstest reads evercert metrics back in tests, from
// evercert's own collectors only (certmetrics.Gatherer).
package certmetricstest

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/testutil"

	"github.com/evercert/evercert/internal/certmetrics"
)

// Value returns the current value of the counter or gauge name with exactly
// labels, or 0 when the series does not exist yet. It gathers every metric:
// to read many series at one moment, Gather once and read the Snapshot.
func Value(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return Gather(t).Value(name, labels)
}

// Snapshot is evercert's metrics as gathered at one moment.
type Snapshot map[string]*dto.MetricFamily

// Gather reads evercert's metrics once.
func Gather(t testing.TB) Snapshot {
	t.Helper()
	families, err := certmetrics.Gatherer().Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	s := make(Snapshot, len(families))
	for _, mf := range families {
		s[mf.GetName()] = mf
	}
	return s
}

// Value is the value of the counter or gauge name with exactly labels in
// the snapshot, or 0 when the series did not exist.
func (s Snapshot) Value(name string, labels map[string]string) float64 {
	mf, ok := s[name]
	if !ok {
		return 0
	}
	for _, m := range mf.GetMetric() {
		if !testutil.LabelsMatch(m, labels) || len(m.GetLabel()) != len(labels) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// SumBy adds up the counters or gauges name whose label has a value keep
// accepts, in one pass over the snapshot.
func (s Snapshot) SumBy(name, label string, keep func(value string) bool) float64 {
	var sum float64
	for _, m := range s[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() != label || !keep(l.GetValue()) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// LoadErrors returns evercert_certificate_load_errors_total{provider}.
func LoadErrors(t testing.TB, provider string) float64 {
	t.Helper()
	return Value(t, "evercert_certificate_load_errors_total", map[string]string{"provider": provider})
}

// Rotations returns evercert_certificate_rotations_total{provider}.
func Rotations(t testing.TB, provider string) float64 {
	t.Helper()
	return Value(t, "evercert_certificate_rotations_total", map[string]string{"provider": provider})
}

// HistogramCount returns the sample count of the histogram name with
// exactly labels, or 0 when the series does not exist yet.
func HistogramCount(t testing.TB, name string, labels map[string]string) uint64 {
	t.Helper()
	n, _ := Histogram(t, name, labels)
	return n
}

// Histogram returns the sample count and sum of the histogram name with
// exactly labels, or zeros when the series does not exist yet.
func Histogram(t testing.TB, name string, labels map[string]string) (count uint64, sum float64) {
	t.Helper()
	families, err := certmetrics.Gatherer().Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil && testutil.LabelsMatch(m, labels) && len(m.GetLabel()) == len(labels) {
				return h.GetSampleCount(), h.GetSampleSum()
			}
		}
	}
	return 0, 0
}

// PodCertificateRequests returns
// evercert_podcertificate_requests_total{signer,result}.
func PodCertificateRequests(t testing.TB, signer, result string) float64 {
	t.Helper()
	return Value(t, "evercert_podcertificate_requests_total", map[string]string{"signer": signer, "result": result})
}
