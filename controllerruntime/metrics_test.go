package controllerruntime

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
)

// TestAddServesMetricsOnTheManagersEndpoint scrapes, over HTTP, the
// metrics endpoints of two real managers, each given its own Add (a
// SelfSigned source on a fake clock of its own, so its leaf rotates when the
// test says). Before, evercert's metrics went to component-base's
// legacyregistry only, which a manager does not serve: an operator's scrape
// and alerts saw no evercert_* series. Now both scrapes show both providers'
// series with their values, each family once next to the manager's own
// process and Go metrics, and the second Add (the registry is one per
// process) is no error.
func TestAddServesMetricsOnTheManagersEndpoint(t *testing.T) {
	first := startMetricsManager(t, "metrics-test-first")
	second := startMetricsManager(t, "metrics-test-second")
	clk := first.clock

	// The first provider's leaf rotates once: step its fake clock past the
	// leaf's renewal, in small steps so a timer set after a step fires on a
	// later one.
	require.Eventually(t, clk.HasWaiters, time.Minute, 10*time.Millisecond)
	leaf := first.serial()
	clk.Step(45 * time.Minute)
	require.Eventually(t, func() bool {
		if first.serial() != leaf {
			return true
		}
		clk.Step(time.Minute)
		return false
	}, time.Minute, 10*time.Millisecond, "the first provider's leaf never rotated")
	require.Eventually(t, func() bool { return certmetricstest.Rotations(t, first.name) == 1 }, time.Minute, 10*time.Millisecond,
		"the rotation was not counted in evercert's own metrics")

	for _, m := range []*metricsManager{first, second} {
		families := scrape(t, m.metricsURL)
		for _, f := range []string{"go_goroutines", "process_start_time_seconds"} {
			assert.Contains(t, families, f, "the manager's own metrics are still served")
		}
		for _, p := range []*metricsManager{first, second} {
			provider := map[string]string{"provider": p.name}
			assert.Equal(t, float64(p.notAfter().Unix()), value(t, m.metricsURL, families, "evercert_certificate_expiration_timestamp_seconds", provider),
				"%s: the served leaf's NotAfter, scraped from %s", p.name, m.metricsURL)
			wantRotations := 0.0
			if p == first {
				wantRotations = 1
			}
			assert.Equal(t, wantRotations, value(t, m.metricsURL, families, "evercert_certificate_rotations_total", provider), "%s from %s", p.name, m.metricsURL)
			assert.Equal(t, 0.0, value(t, m.metricsURL, families, "evercert_certificate_load_errors_total", provider), "%s from %s", p.name, m.metricsURL)
			assert.Equal(t, 0.0, value(t, m.metricsURL, families, "evercert_unsafe_rotations_total", provider), "%s from %s", p.name, m.metricsURL)
			assert.Equal(t, 0.0, value(t, m.metricsURL, families, "evercert_ca_rotation_pending_observers", provider), "%s from %s", p.name, m.metricsURL)
		}
	}
}

// metricsManager is a started manager that Add was given a SelfSigned
// source named name, on clock.
type metricsManager struct {
	name       string
	source     *authority.SelfSigned
	clock      *clocktesting.FakeClock
	metricsURL string
}

// serial returns the serial number of the leaf the source serves now.
func (m *metricsManager) serial() string {
	leaf := m.leaf()
	if leaf == nil {
		return ""
	}
	return leaf.SerialNumber.Text(16)
}

// notAfter returns the NotAfter of the leaf the source serves now.
func (m *metricsManager) notAfter() time.Time { return m.leaf().NotAfter }

// leaf returns the leaf the source serves now, nil before the first.
func (m *metricsManager) leaf() *x509.Certificate {
	_, _, cert := m.source.CurrentParsedCertKeyContent()
	if cert == nil {
		return nil
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		panic(fmt.Sprintf("the served leaf does not parse: %v", err))
	}
	return leaf
}

// startMetricsManager starts a manager serving metrics on a port of
// 127.0.0.1, with Add given a SelfSigned source named name on a fake clock, and
// waits until Ready is closed (the first leaf served). Both stop when the
// test ends.
func startMetricsManager(t *testing.T, name string) *metricsManager {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	source, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Name: name, Hosts: []string{"127.0.0.1"}, Lifetime: time.Hour, CALifetime: 24 * time.Hour, Clock: clk,
	})
	require.NoError(t, err)
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	mgr, err := ctrl.NewManager(&rest.Config{Host: "https://127.0.0.1:1"}, ctrl.Options{
		Metrics:       metricsserver.Options{BindAddress: metricsAddr},
		WebhookServer: webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: freePort(t)}),
	})
	require.NoError(t, err)
	certs, err := Add(mgr, Config{Source: source, Clock: clk})
	require.NoError(t, err, "Add on manager %s", name)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-certs.Ready():
	case err := <-done:
		t.Fatalf("manager %s stopped: %v", name, err)
	case <-time.After(time.Minute):
		t.Fatalf("manager %s: Ready not closed", name)
	}
	return &metricsManager{name: name, source: source, clock: clk, metricsURL: "http://" + metricsAddr + "/metrics"}
}

// scrape GETs url (a manager's metrics endpoint, which starts with the
// manager and so may not listen yet) and parses the text exposition,
// which fails on a family served twice.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	var body []byte
	require.Eventually(t, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", url, body)
		return true
	}, time.Minute, 50*time.Millisecond, "GET %s", url)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err, "parsing the scrape of %s", url)
	return families
}

// value returns the value of the counter or gauge series name{labels} in
// the scrape of url, and fails the test when it is not there.
func value(t *testing.T, url string, families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	for _, m := range families[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if fmt.Sprint(got) != fmt.Sprint(labels) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		}
	}
	var want []string
	for k, v := range labels {
		want = append(want, fmt.Sprintf("%s=%q", k, v))
	}
	t.Fatalf("%s{%s} is not served on %s", name, strings.Join(want, ","), url)
	return 0
}
