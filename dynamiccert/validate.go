package dynamiccert

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ValidateHost checks one entry of a list of hosts a leaf is made for
// (SelfSignedConfig.Hosts, authority.Config.Hosts, server's
// --self-signed-hosts): a DNS name (an RFC 1123 subdomain such as
// "webhook.ns.svc"; upper case is accepted, as names compare without
// case), a wildcard "*.<DNS name>", or an IPv4 or IPv6 address without a
// zone. Anything else would become a SAN no client verifies (an IP
// written as a name, a name with a port, a URL, a name with a space from
// "a, b"), so that the server would start, report ready and serve nobody.
// The error says what the value looks like instead, not which field or
// flag it came from: the caller adds that.
func ValidateHost(host string) error {
	lower := strings.ToLower(host)
	ip, ipErr := netip.ParseAddr(host)
	if ipErr == nil && ip.Zone() == "" || isDNSName(strings.TrimPrefix(lower, "*.")) {
		return nil
	}
	var why string
	switch {
	case host == "":
		why = "empty"
	case ipErr == nil:
		why = fmt.Sprintf("an IP address with a zone, which a certificate cannot hold; leave out %q", "%"+ip.Zone())
	case strings.Contains(host, "://"):
		why = "a URL; give the host name alone"
	case strings.ContainsAny(host, " \t\n\r,"):
		why = "several names or spaces in one value; give each name as its own entry, without spaces"
	case strings.Contains(host, "/"):
		if _, err := netip.ParsePrefix(host); err == nil {
			why = "a network (CIDR), which a certificate cannot hold; give each IP address"
		} else {
			why = "a path or network, not a name"
		}
	case isHostPort(host):
		why = "a host and a port; give the host alone"
	case strings.Contains(host, "*"):
		why = "a wildcard other than a leading \"*.\" followed by a DNS name"
	case strings.HasSuffix(host, "."):
		why = "a name with a trailing dot; leave the dot out"
	default:
		why = "not a DNS name (RFC 1123: letters, digits, '-' and '.', labels of at most 63 characters that start and end with a letter or digit, at most 253 characters in all)"
	}
	return fmt.Errorf("%q is %s: want a DNS name, a wildcard (*.example.com) or an IP address", host, why)
}

// isDNSName reports whether s is an RFC 1123 subdomain in lower case whose
// labels are at most 63 characters long (which the subdomain check of
// apimachinery leaves out).
func isDNSName(s string) bool {
	if len(validation.IsDNS1123Subdomain(s)) > 0 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if len(label) > validation.DNS1123LabelMaxLength {
			return false
		}
	}
	return true
}

// isHostPort reports whether s is "host:port" or "[ip]:port".
func isHostPort(s string) bool {
	if _, err := netip.ParseAddrPort(s); err == nil {
		return true
	}
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 || strings.Count(s, ":") != 1 {
		return false
	}
	for _, c := range s[i+1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ValidateHosts checks every entry of hosts with ValidateHost; each error
// names field (a configuration field such as "Hosts", or a flag such as
// "--self-signed-hosts") and the entry's index.
func ValidateHosts(field string, hosts []string) error {
	var errs []error
	for i, h := range hosts {
		if err := ValidateHost(h); err != nil {
			errs = append(errs, fmt.Errorf("%s[%d]: %w", field, i, err))
		}
	}
	return errors.Join(errs...)
}

// MaxLifetime is the longest leaf Lifetime or CALifetime accepted, and the
// longest CA lifetime a default may make (3 × Lifetime for SelfSigned, 8 ×
// Lifetime for an Authority). It is far beyond any certificate in use, and
// leaves room in a time.Duration (about 292 years) for the durations the
// rotation schedule adds to it; a longer one used to overflow into a
// negative CA lifetime ("lifetimes must be positive").
const MaxLifetime = 200 * 365 * 24 * time.Hour
