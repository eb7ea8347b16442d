// Package prometheus holds evercert's Prometheus alerting rules (rules.yaml,
// and evercert-rules.yaml, the PrometheusRule generated from it) and their
// tests: promtool's unit tests (rules_test.yaml, run by make test-alerts),
// and the Go tests here, which keep the PrometheusRule in sync with the
// rule file and every metric the rules use in sync with what evercert
// serves.
package prometheus

import (
	"crypto/tls"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/tlstest"
)

var update = flag.Bool("update", false, "regenerate evercert-rules.yaml from rules.yaml")

const (
	ruleFile       = "rules.yaml"
	prometheusRule = "evercert-rules.yaml"
)

// ruleGroups is the part of a rule file (and of a PrometheusRule's spec)
// the tests read.
type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record string `json:"record"`
			Alert  string `json:"alert"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

// generatePrometheusRule wraps the rule file's groups in a PrometheusRule:
// the file from its "groups:" line on, comments included, becomes the spec.
func generatePrometheusRule(t *testing.T, rules []byte) []byte {
	t.Helper()
	i := regexp.MustCompile(`(?m)^groups:`).FindIndex(rules)
	require.NotNil(t, i, "%s has no top-level groups:", ruleFile)
	var b strings.Builder
	b.WriteString(`# Generated from rules.yaml; do not edit. Edit rules.yaml, then run
#   go test ./deploy/prometheus/ -run TestPrometheusRuleInSync -update
# The Prometheus Operator picks it up if its ruleSelector (and
# ruleNamespaceSelector) match: add the labels your Prometheus selects on.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: evercert
  labels:
    app.kubernetes.io/name: evercert
spec:
`)
	for _, line := range strings.SplitAfter(string(rules[i[0]:]), "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString("  ")
		}
		b.WriteString(line)
	}
	return []byte(b.String())
}

// TestPrometheusRuleInSync checks that evercert-rules.yaml is exactly what
// rules.yaml generates, and that it is a PrometheusRule holding the same
// groups. With -update it rewrites evercert-rules.yaml.
func TestPrometheusRuleInSync(t *testing.T) {
	rules, err := os.ReadFile(ruleFile)
	require.NoError(t, err)
	want := generatePrometheusRule(t, rules)
	if *update {
		require.NoError(t, os.WriteFile(prometheusRule, want, 0o644))
	}
	got, err := os.ReadFile(prometheusRule)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "%s is stale: run go test ./deploy/prometheus/ -run TestPrometheusRuleInSync -update", prometheusRule)

	var plain ruleGroups
	require.NoError(t, yaml.Unmarshal(rules, &plain))
	var crd struct {
		APIVersion string     `json:"apiVersion"`
		Kind       string     `json:"kind"`
		Spec       ruleGroups `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(got, &crd))
	assert.Equal(t, "monitoring.coreos.com/v1", crd.APIVersion)
	assert.Equal(t, "PrometheusRule", crd.Kind)
	assert.Equal(t, plain, crd.Spec)
	require.NotEmpty(t, plain.Groups)
}

var (
	metricName = regexp.MustCompile(`\bevercert_[a-z0-9_]+`)
	// selector matches a metric name with its label matchers.
	selector = regexp.MustCompile(`\b(evercert_[a-z0-9_]+)\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	// grouping matches the labels of by (...) and without (...).
	grouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// TestRuleMetricsExist scrapes /metrics of a running example server (built
// and run as a subprocess, with its self-signed default, a CA bundle file
// and its loopback self-check) and checks that every metric the rules use
// is served, with every label the rules select or group on, and that every
// label value they select is one the metric's help lists. Renaming a
// metric, a label or a value breaks it.
func TestRuleMetricsExist(t *testing.T) {
	data, err := os.ReadFile(ruleFile)
	require.NoError(t, err)
	var rules ruleGroups
	require.NoError(t, yaml.Unmarshal(data, &rules))

	bin := proctest.Build(t, "github.com/evercert/evercert/example/server")
	bundle := filepath.Join(t.TempDir(), "ca.crt")
	_, addr := proctest.Start(t, bin, regexp.MustCompile(`serving on https://([0-9.:\[\]a-f]+)`),
		"--secure-port=0", "--ca-bundle-file="+bundle, "--loopback-selfcheck-interval=100ms")
	caPEM, err := os.ReadFile(bundle)
	require.NoError(t, err)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: tlstest.Pool(t, caPEM), ServerName: "localhost"},
	}}
	var metrics string
	require.Eventually(t, func() bool {
		resp, err := c.Get("https://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		metrics = string(body)
		// The self-check runs after start-up.
		return err == nil && strings.Contains(metrics, "evercert_loopback_selfcheck_total{")
	}, 30*time.Second, 100*time.Millisecond, "the example server's /metrics")

	// labelsOf returns the label names of name's series in the scrape.
	labelsOf := func(name string) []string {
		var labels []string
		for _, m := range regexp.MustCompile(`(?m)^`+name+`\{([^}]*)\}`).FindAllStringSubmatch(metrics, -1) {
			for _, l := range matcher.FindAllStringSubmatch(m[1], -1) {
				if !slices.Contains(labels, l[1]) {
					labels = append(labels, l[1])
				}
			}
		}
		return labels
	}
	helpOf := func(name string) string {
		m := regexp.MustCompile(`(?m)^# HELP ` + name + ` (.*)$`).FindStringSubmatch(metrics)
		if m == nil {
			return ""
		}
		return m[1]
	}

	served := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) `).FindAllStringSubmatch(metrics, -1) {
		served[m[1]] = true
	}
	used := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			rule := r.Alert + r.Record
			names := slices.Compact(slices.Sorted(slices.Values(metricName.FindAllString(r.Expr, -1))))
			for _, name := range names {
				used++
				assert.True(t, served[name], "rule %s uses %s, which evercert does not serve", rule, name)
			}
			for _, sel := range selector.FindAllStringSubmatch(r.Expr, -1) {
				name, have, help := sel[1], labelsOf(sel[1]), helpOf(sel[1])
				for _, m := range matcher.FindAllStringSubmatch(sel[2], -1) {
					assert.Contains(t, have, m[1], "rule %s selects label %s of %s", rule, m[1], name)
					for _, value := range strings.Split(m[3], "|") {
						assert.Regexp(t, `\b`+regexp.QuoteMeta(value)+`\b`, help, "rule %s selects %s=%q; the help of %s does not list it", rule, m[1], value, name)
					}
				}
			}
			for _, grp := range grouping.FindAllStringSubmatch(r.Expr, -1) {
				for _, label := range strings.Split(grp[1], ",") {
					label = strings.TrimSpace(label)
					for _, name := range names {
						assert.Contains(t, labelsOf(name), label, "rule %s groups %s by label %s", rule, name, label)
					}
				}
			}
		}
	}
	assert.Positive(t, used, "the rules use no evercert metric")
}
