//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/testutil"
)

// This file reads the kube-apiserver's own request counters, which is how
// an operator judges a controller's cost: apiserver_request_total (labels
// verb, group, resource, subresource, code, ...) from /metrics, read with
// the admin identity, as deltas between two scrapes.
//
// Attribution. apiserver_request_total has no user label, so it counts the
// kube-apiserver's own loopback traffic (its identity Lease in kube-system,
// its bootstrap controllers) and the test's informers along with the
// replicas. Two measures attribute the requests to the replicas:
//
//   - The replicas run as their own ServiceAccount, which a FlowSchema of
//     their own matches (API Priority and Fairness is on in these tests).
//     apiserver_flowcontrol_request_execution_seconds_count{flow_schema=<it>,
//     type="regular"} counts exactly the non-watch requests the replicas'
//     identity sent and the server executed (type="watch" counts watch
//     initialisations; requests APF rejected with 429 are in
//     apiserver_flowcontrol_rejected_requests_total instead). The budget
//     assertions use this count.
//   - The per-verb/resource table is apiserver_request_total's delta over
//     the measured window minus its delta over a baseline window of the
//     same length, taken earlier with the cluster idle and no replica
//     running (testcluster runs no kube-controller-manager, scheduler or
//     kubelet; the test's own informers are already started and quiet).
//     What is left is the replicas' traffic plus the jitter of the
//     server's own periodic work; the report prints both totals so the two
//     measures can be compared.

// apiMetrics is one scrape of the kube-apiserver's /metrics.
type apiMetrics struct {
	at time.Time
	m  testutil.Metrics
}

// scrapeAPIServer reads the kube-apiserver's /metrics with cfg (the admin
// identity: system:masters may GET it).
func scrapeAPIServer(t *testing.T, cfg *rest.Config) apiMetrics {
	t.Helper()
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatalf("kube-apiserver /metrics: build client: %v", err)
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/metrics", nil)
	if err != nil {
		t.Fatalf("kube-apiserver /metrics: %v", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("kube-apiserver /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("kube-apiserver /metrics: %s %v", resp.Status, err)
	}
	m := testutil.NewMetrics()
	if err := testutil.ParseMetrics(string(body), &m); err != nil {
		t.Fatalf("kube-apiserver /metrics: parse: %v", err)
	}
	return apiMetrics{at: time.Now(), m: m}
}

// sum adds the samples of metric whose labels include every pair in match.
func (a apiMetrics) sum(metric string, match map[string]string) float64 {
	var total float64
	for _, s := range a.m[metric] {
		ok := true
		for k, v := range match {
			if string(s.Metric[testutilLabel(k)]) != v {
				ok = false
				break
			}
		}
		if ok {
			total += float64(s.Value)
		}
	}
	return total
}

func testutilLabel(name string) testutil.LabelName { return testutil.LabelName(name) }

// requestKey is one row of the per-verb/resource table: the labels of
// apiserver_request_total that say what was asked and how it ended
// (version, scope, component and dry_run are summed over).
type requestKey struct {
	verb, group, resource, subresource, code string
}

func (k requestKey) String() string {
	res := k.resource
	if k.group != "" {
		res += "." + k.group
	}
	if k.subresource != "" {
		res += "/" + k.subresource
	}
	return fmt.Sprintf("%-7s %-40s %s", k.verb, res, k.code)
}

// requestCounts is apiserver_request_total summed by requestKey.
type requestCounts map[requestKey]float64

func (a apiMetrics) requests() requestCounts {
	out := requestCounts{}
	for _, s := range a.m["apiserver_request_total"] {
		l := s.Metric
		out[requestKey{
			verb: string(l["verb"]), group: string(l["group"]), resource: string(l["resource"]),
			subresource: string(l["subresource"]), code: string(l["code"]),
		}] += float64(s.Value)
	}
	return out
}

// requestDelta is after minus before, by key; keys that did not change are
// left out.
func requestDelta(before, after apiMetrics) requestCounts {
	b, a := before.requests(), after.requests()
	out := requestCounts{}
	for k, v := range a {
		if d := v - b[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// minus subtracts a baseline delta (scaled by scale, the ratio of the two
// windows' lengths) from c, keeping keys whose result is not zero; a
// negative result (the server's own periodic work happened to fall into
// the baseline more often) is kept, so the table shows the noise.
func (c requestCounts) minus(baseline requestCounts, scale float64) requestCounts {
	out := requestCounts{}
	for k, v := range c {
		out[k] = v
	}
	for k, v := range baseline {
		out[k] -= v * scale
	}
	for k, v := range out {
		if v > -0.05 && v < 0.05 {
			delete(out, k)
		}
	}
	return out
}

// nonWatch is the total of every verb but WATCH.
func (c requestCounts) nonWatch() float64 {
	var n float64
	for k, v := range c {
		if k.verb != "WATCH" {
			n += v
		}
	}
	return n
}

// withCode is the total of requests that ended with code.
func (c requestCounts) withCode(code string) float64 {
	var n float64
	for k, v := range c {
		if k.code == code {
			n += v
		}
	}
	return n
}

// table renders c, one row per key, sorted by verb, resource and code,
// each with its count and the count per replica (replicas > 0) and per
// minute (window > 0).
func (c requestCounts) table(replicas int, window time.Duration) string {
	keys := make([]requestKey, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b requestKey) int { return strings.Compare(a.String(), b.String()) })
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-7s %-40s %-4s %8s", "VERB", "RESOURCE", "CODE", "COUNT")
	if replicas > 0 {
		fmt.Fprintf(&sb, " %12s", "PER REPLICA")
	}
	if window > 0 {
		fmt.Fprintf(&sb, " %18s", "PER REPLICA/MIN")
	}
	sb.WriteString("\n")
	for _, k := range keys {
		fmt.Fprintf(&sb, "%s %8.1f", k, c[k])
		if replicas > 0 {
			fmt.Fprintf(&sb, " %12.2f", c[k]/float64(replicas))
		}
		if window > 0 && replicas > 0 {
			fmt.Fprintf(&sb, " %18.2f", c[k]/float64(replicas)/window.Minutes())
		}
		sb.WriteString("\n")
	}
	fmt.Fprintf(&sb, "non-watch total %.1f", c.nonWatch())
	return sb.String()
}

// flowCounts is what APF counted for one FlowSchema between two scrapes.
type flowCounts struct {
	// executed is the non-watch requests executed (type="regular").
	executed float64
	// watches is the watch requests initialised (type="watch").
	watches float64
	// rejected is the requests rejected with 429 (queue full, timed out
	// in the queue, concurrency limit).
	rejected float64
	// dispatched is every request dispatched, watches included.
	dispatched float64
}

func flowDelta(before, after apiMetrics, flowSchema string) flowCounts {
	d := func(metric string, match map[string]string) float64 {
		match["flow_schema"] = flowSchema
		return after.sum(metric, match) - before.sum(metric, match)
	}
	return flowCounts{
		executed:   d("apiserver_flowcontrol_request_execution_seconds_count", map[string]string{"type": "regular"}),
		watches:    d("apiserver_flowcontrol_request_execution_seconds_count", map[string]string{"type": "watch"}),
		rejected:   d("apiserver_flowcontrol_rejected_requests_total", map[string]string{}),
		dispatched: d("apiserver_flowcontrol_dispatched_requests_total", map[string]string{}),
	}
}
