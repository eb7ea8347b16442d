package deploy

import (
	"strings"
	"testing"

	"github.com/evercert/evercert/test/deploy/chart"
)

// TestHelmChartRefusesBrokenValues renders each chart (helm template) with
// values that the API server would accept but that break the deployable or
// widen its permissions at run time: helm template (and so helm install and
// helm upgrade) must refuse them with a message that names the value, before
// anything reaches the cluster. A binary that exits on a bad flag is found
// only once its pods crash-loop; a webhook with no replica and
// failurePolicy Fail blocks every write it matches; an RBAC rule with no
// resourceNames grants every object of its resource.
func TestHelmChartRefusesBrokenValues(t *testing.T) {
	for _, c := range []struct {
		chart, name string
		vals        map[string]any
		want        string // in the error
	}{
		// With neither caBundle target the ClusterRole's resourceNames
		// rendered empty: the webhook's ServiceAccount could then patch
		// every validating and mutating webhook configuration of the
		// cluster (re-point another's clientConfig at itself).
		{"webhook", "no caBundle target", map[string]any{"caBundle": map[string]any{"validatingWebhookConfiguration": "", "mutatingWebhookConfiguration": ""}}, "caBundle"},
		{"webhook", "replicaCount 0", map[string]any{"replicaCount": 0}, "replicaCount"},
		{"signer", "replicaCount 0", map[string]any{"replicaCount": 0}, "replicaCount"},
		{"apiserver", "replicaCount 0", map[string]any{"replicaCount": 0}, "replicaCount"},
		{"signer", "replicaCount negative", map[string]any{"replicaCount": -1}, "replicaCount"},
		{"webhook", "replicaCount typed as replicas", map[string]any{"replicas": 5}, "replicas"},
		// --set caPropagationDelay=3600 gives a number: the binary refuses
		// "3600" (a duration needs a unit) and every pod crash-loops.
		{"webhook", "caPropagationDelay without unit", map[string]any{"caPropagationDelay": 3600}, "caPropagationDelay"},
		{"signer", "caPropagationDelay not a duration", map[string]any{"caPropagationDelay": "1hour"}, "caPropagationDelay"},
		{"webhook", "keyTypes unknown", map[string]any{"keyTypes": []any{"ecdsa-p265"}}, "keyTypes"},
		{"signer", "keyTypes unknown", map[string]any{"keyTypes": []any{"ECDSA256"}}, "keyTypes"},
		{"signer", "caKeyTypes unknown", map[string]any{"caKeyTypes": []any{"rsa-1024"}}, "caKeyTypes"},
		{"apiserver", "keyType unknown", map[string]any{"keyType": "ECDSAP265"}, "keyType"},
	} {
		t.Run(c.chart+"/"+c.name, func(t *testing.T) {
			var d chart.Deployable
			for _, x := range chart.Deployables {
				if x.Name == c.chart {
					d = x
				}
			}
			_, err := chart.Template(loadChart(t, d), valuesNamespace, c.vals)
			if err == nil {
				t.Fatalf("helm template deploy/helm/%s with %v: no error, want one naming %s", c.chart, c.vals, c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("helm template deploy/helm/%s with %v: %v, want an error naming %s", c.chart, c.vals, err, c.want)
			}
			t.Logf("helm template deploy/helm/%s with %v: %v", c.chart, c.vals, err)
		})
	}
}

// TestHelmChartAcceptsValidValues: the refusals of
// TestHelmChartRefusesBrokenValues stop at what the binaries refuse; values
// they accept render (the zero delay, which means the default; durations of
// several units; key types in any case where the flag ignores case; a tag
// that --set turns into a number; one caBundle target only; the global
// values an umbrella chart passes to its dependencies).
func TestHelmChartAcceptsValidValues(t *testing.T) {
	for _, c := range []struct {
		chart, name string
		vals        map[string]any
	}{
		{"webhook", "zero delay", map[string]any{"caPropagationDelay": "0"}},
		{"signer", "delay of several units", map[string]any{"caPropagationDelay": "1h30m0.5s"}},
		{"webhook", "key types in upper case", map[string]any{"keyTypes": []any{"ECDSA-P384", "rsa-2048"}}},
		{"signer", "CA key types in upper case", map[string]any{"caKeyTypes": []any{"RSA-3072"}}},
		{"apiserver", "numeric tag", map[string]any{"image": map[string]any{"repository": "r/apiserver", "tag": 2}}},
		{"webhook", "validating webhook only", map[string]any{"caBundle": map[string]any{"mutatingWebhookConfiguration": ""}}},
		{"signer", "one replica", map[string]any{"replicaCount": 1}},
		{"webhook", "global values of an umbrella chart", map[string]any{"global": map[string]any{"imageRegistry": "registry.example.com"}}},
	} {
		t.Run(c.chart+"/"+c.name, func(t *testing.T) {
			for _, d := range chart.Deployables {
				if d.Name == c.chart {
					templateObjects(t, loadChart(t, d), valuesNamespace, c.vals)
				}
			}
		})
	}
}
