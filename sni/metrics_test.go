package sni

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/component-base/metrics/legacyregistry"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/klogtest"
	"github.com/evercert/evercert/internal/pki"
)

// certificateSeries returns the provider labels of the evercert_certificate_*
// series whose provider starts with prefix, per metric name.
func certificateSeries(t testing.TB, prefix string) map[string][]string {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	require.NoError(t, err)
	out := map[string][]string{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "evercert_certificate_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "provider" && strings.HasPrefix(l.GetValue(), prefix) {
					out[mf.GetName()] = append(out[mf.GetName()], l.GetValue())
				}
			}
		}
	}
	return out
}

// TestPerProviderMetricsLimit: up to the limit, each provider the controller
// parses has its own evercert_certificate_* series, as before; above it
// (by default above 1,000 providers), none of them has, and the series
// labelled with the controller's name count their rotations and load
// errors and hold the earliest NotAfter they serve, through the Run loop's
// notifications.
func TestPerProviderMetricsLimit(t *testing.T) {
	klogtest.Discard(t)
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "ca")
	key, err := pki.GenerateKey(pki.ECDSAP256)
	require.NoError(t, err)
	leaf := func(cn string, lifetime time.Duration) *pki.Issued {
		iss, err := pki.IssueLeaf(ca, pki.Request{CommonName: cn, DNSNames: []string{cn}, Now: clk.Now(), Lifetime: lifetime, Key: key})
		require.NoError(t, err)
		return iss
	}
	providers := func(prefix string, n int) ([]dynamiccertificates.SNICertKeyContentProvider, []*mutableProvider) {
		var sni []dynamiccertificates.SNICertKeyContentProvider
		var ps []*mutableProvider
		for i := range n {
			// Provider 1 expires first.
			lifetime := 12 * time.Hour
			if i == 1 {
				lifetime = 6 * time.Hour
			}
			p := newMutable(fmt.Sprintf("%s-%d", prefix, i), leaf(fmt.Sprintf("host-%d.test", i), lifetime))
			sni, ps = append(sni, p), append(ps, p)
		}
		return sni, ps
	}

	t.Run("below the limit: a series each", func(t *testing.T) {
		prefix := "own-" + t.Name()
		sni, _ := providers(prefix, 3)
		c := newController(t, ControllerConfig{SNI: sni, Clock: clk, Name: prefix + "-controller"})
		require.NoError(t, c.RunOnce(context.Background()))
		series := certificateSeries(t, prefix)
		for _, m := range []string{"evercert_certificate_expiration_timestamp_seconds", "evercert_certificate_rotations_total", "evercert_certificate_load_errors_total"} {
			assert.ElementsMatch(t, []string{prefix + "-0", prefix + "-1", prefix + "-2"}, series[m], m)
		}
	})

	for _, tc := range []struct {
		name  string
		n     int
		limit int
	}{
		{"above the default limit", DefaultPerProviderMetricsLimit + 1, 0},
		{"always together", 3, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := strings.NewReplacer(" ", "-", "/", "-").Replace(t.Name())
			name := prefix + "-controller"
			sni, ps := providers(prefix+"-p", tc.n)
			// Counted from here: with -count, an earlier run counted under
			// the same name.
			rotationsBefore := metricValue(t, "evercert_certificate_rotations_total", name)
			rotations := func() float64 {
				return metricValue(t, "evercert_certificate_rotations_total", name) - rotationsBefore
			}
			errorsBefore := loadErrors(t, name)
			c := newController(t, ControllerConfig{SNI: sni, Clock: clk, Name: name, PerProviderMetricsLimit: tc.limit})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				c.Run(ctx, 1)
			}()
			defer func() {
				cancel()
				<-done
			}()
			require.Eventually(t, c.HasSynced, time.Minute, 10*time.Millisecond)

			assert.Empty(t, certificateSeries(t, prefix+"-p"), "no series per provider")
			expiration := func() float64 {
				return metricValue(t, "evercert_certificate_expiration_timestamp_seconds", name)
			}
			assert.Equal(t, float64(clk.Now().Add(6*time.Hour).Unix()), expiration(), "the earliest NotAfter")
			assert.Equal(t, map[string][]string{
				"evercert_certificate_expiration_timestamp_seconds": {name},
				"evercert_certificate_rotations_total":              {name},
				"evercert_certificate_load_errors_total":            {name},
			}, certificateSeries(t, name), "the controller's series exist from the start")

			// The earliest one rotates: a rotation, and the next earliest
			// NotAfter.
			ps[1].SetIssued(leaf("host-1.test", 24*time.Hour))
			require.Eventually(t, func() bool { return rotations() == 1 }, time.Minute, 10*time.Millisecond)
			require.Eventually(t, func() bool { return expiration() == float64(clk.Now().Add(12*time.Hour).Unix()) },
				time.Minute, 10*time.Millisecond)
			// Another gets one expiring sooner: the earliest at once.
			ps[2].SetIssued(leaf("host-2.test", 3*time.Hour))
			require.Eventually(t, func() bool { return expiration() == float64(clk.Now().Add(3*time.Hour).Unix()) },
				time.Minute, 10*time.Millisecond)
			// Bad content: one load error, counted together.
			ps[0].Set([]byte("not PEM"), []byte("not PEM"))
			require.Eventually(t, func() bool { return loadErrors(t, name)-errorsBefore == 1 }, time.Minute, 10*time.Millisecond)
			assert.Equal(t, 2.0, rotations())
			assert.Empty(t, certificateSeries(t, prefix+"-p"), "still no series per provider")
		})
	}
}
