package dynamiccert

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestValidateHost: DNS names, wildcards and IP addresses are accepted;
// what would become a SAN no client verifies is refused, and the error
// quotes the value and says what it looks like.
func TestValidateHost(t *testing.T) {
	for _, h := range []string{
		"localhost", "webhook.ns.svc", "webhook.ns.svc.cluster.local", "Webhook.Example.COM", "a", "1a.b-c.d",
		"*.example.com", "*.svc", "127.0.0.1", "::1", "10.0.0.1", "2001:db8::1", "::ffff:10.0.0.1",
		strings.Repeat("a", 63) + "." + strings.Repeat("b", 63),
	} {
		assert.NoError(t, ValidateHost(h), "%q", h)
	}
	for _, tc := range []struct{ host, why string }{
		{"", "empty"},
		{"host:443", "a host and a port"},
		{"webhook.ns.svc:8443", "a host and a port"},
		{"[::1]:443", "a host and a port"},
		{"127.0.0.1:443", "a host and a port"},
		{"https://host", "a URL"},
		{"http://10.0.0.1/", "a URL"},
		{" b", "spaces"},
		{"a, b", "several names"},
		{"a,b", "several names"},
		{"10.0.0.1/32", "a network (CIDR)"},
		{"fd00::/64", "a network (CIDR)"},
		{"a/b", "a path or network"},
		{"fe80::1%eth0", "with a zone"},
		{"*", "a wildcard other than"},
		{"*example.com", "a wildcard other than"},
		{"a.*.example.com", "a wildcard other than"},
		{"*.*.example.com", "a wildcard other than"},
		{"example.com.", "trailing dot"},
		{"under_score.example", "not a DNS name"},
		{"-leading.example", "not a DNS name"},
		{"a..b", "not a DNS name"},
		{"ünïcode.example", "not a DNS name"},
		{strings.Repeat("a", 64) + ".example", "not a DNS name"},
		{"256.1.1.1", ""}, // a valid DNS name by RFC 1123, so accepted
	} {
		err := ValidateHost(tc.host)
		if tc.why == "" {
			assert.NoError(t, err, "%q", tc.host)
			continue
		}
		if assert.Error(t, err, "%q", tc.host) {
			assert.Contains(t, err.Error(), `"`+tc.host+`"`, "the error quotes the value")
			assert.Contains(t, err.Error(), tc.why)
			assert.Contains(t, err.Error(), "want a DNS name, a wildcard (*.example.com) or an IP address")
		}
	}
	err := ValidateHosts("--self-signed-hosts", []string{"ok.example", "host:443", "10.0.0.1"})
	require.Error(t, err)
	assert.Equal(t, `--self-signed-hosts[1]: "host:443" is a host and a port; give the host alone: want a DNS name, a wildcard (*.example.com) or an IP address`, err.Error())
}
