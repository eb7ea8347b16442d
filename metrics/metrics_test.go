package metrics_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/metrics"
)

// TestCollectorServesTheLegacyRegistrysEvercertSeries shows that a registry
// of its own with the process and Go collectors takes Collector without a
// conflict, refuses it a second time as already registered, and then
// gathers exactly the evercert_* families the legacyregistry gathers, with
// the same labels and values.
func TestCollectorServesTheLegacyRegistrysEvercertSeries(t *testing.T) {
	const p = "metrics-package-test"
	certmetrics.CertificateLoaded(p, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), false)
	certmetrics.CertificateLoaded(p, time.Date(2030, 1, 2, 0, 0, 0, 0, time.UTC), true)
	certmetrics.PendingObservers(p, 0)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	require.NoError(t, reg.Register(metrics.Collector()))
	var already prometheus.AlreadyRegisteredError
	require.True(t, errors.As(reg.Register(metrics.Collector()), &already), "a second Collector is refused as already registered")

	got, err := reg.Gather()
	require.NoError(t, err)
	want, err := legacyregistry.DefaultGatherer.Gather()
	require.NoError(t, err)
	assert.Equal(t, evercertFamilies(want), evercertFamilies(got))
	assert.Contains(t, evercertFamilies(got), "evercert_certificate_rotations_total")
	assert.Contains(t, evercertFamilies(got)["evercert_certificate_rotations_total"], "{provider="+p+"} 1")
}

// evercertFamilies renders the evercert_* families as name to their series,
// each as its labels and value.
func evercertFamilies(mfs []*dto.MetricFamily) map[string][]string {
	out := map[string][]string{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "evercert_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			var v float64
			switch {
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				v = float64(m.GetHistogram().GetSampleCount())
			}
			out[mf.GetName()] = append(out[mf.GetName()], fmt.Sprintf("{%s} %g", strings.Join(labels, ","), v))
		}
	}
	return out
}
