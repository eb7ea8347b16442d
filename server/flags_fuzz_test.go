package server_test

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"

	"github.com/evercert/evercert/server"
)

// parseSNIFlag parses one --tls-sni-cert-key=value into fresh Options and
// validates them; errs holds the parse error or the validation errors.
func parseSNIFlag(value string) (opts *server.Options, errs []error) {
	opts = server.NewOptions()
	fs := pflag.NewFlagSet("fuzz", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	opts.AddFlags(fs)
	if err := fs.Parse([]string{"--tls-sni-cert-key=" + value}); err != nil {
		return opts, []error{err}
	}
	return opts, opts.Validate()
}

// FuzzSNICertKeyFlag parses arbitrary --tls-sni-cert-key values.
//
// Properties: no panic; when parsing and Validate both succeed there is
// exactly one entry, its certificate and key paths are non-empty, trimmed and
// free of the separators, and it survives a round trip through its String
// form.
func FuzzSNICertKeyFlag(f *testing.F) {
	for _, seed := range []string{
		"a.crt,a.key",
		"a.crt,a.key:foo.com,*.bar.com",
		",",
		"a.crt",
		"a,b,c",
		":",
		"a.crt,a.key:",
		" a.crt , a.key : foo.com , bar.com ",
		"a.crt,a.key:foo.com,",
		"a.crt,:foo.com",
		",a.key",
		"a.crt,a.key:foo:bar",
		"/etc/tls/a b.crt,/etc/tls/a b.key:127.0.0.1,::1",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		opts, errs := parseSNIFlag(value)
		if len(errs) > 0 {
			return
		}
		if len(opts.SNICertKeys) != 1 {
			t.Fatalf("one flag gave %d entries: %+v", len(opts.SNICertKeys), opts.SNICertKeys)
		}
		nck := opts.SNICertKeys[0]
		for what, path := range map[string]string{"certificate": nck.CertFile, "key": nck.KeyFile} {
			switch {
			case path == "":
				t.Fatalf("%q: accepted an empty %s file", value, what)
			case path != strings.TrimSpace(path):
				t.Fatalf("%q: %s file %q is not trimmed", value, what, path)
			case strings.ContainsAny(path, ",:"):
				t.Fatalf("%q: %s file %q holds a separator", value, what, path)
			}
		}
		var again cliflag.NamedCertKey
		if err := again.Set(nck.String()); err != nil {
			t.Fatalf("%q: String() form %q does not parse: %v", value, nck.String(), err)
		}
		if again.CertFile != nck.CertFile || again.KeyFile != nck.KeyFile || !slices.Equal(again.Names, nck.Names) {
			t.Fatalf("%q: round trip changed %+v into %+v", value, nck, again)
		}
	})
}
