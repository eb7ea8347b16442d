package app

import (
	"html/template"
	"net/http"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/evercert/evercert/server"
	"github.com/evercert/evercert/sni"
)

var statusTemplate = template.Must(template.New("status").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>evercert</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}</style>
</head><body>
<h1>evercert example server</h1>
<p>Now: {{.Now}}</p>
<table>
<tr><th>provider</th><th>role</th><th>subject</th><th>key</th><th>names</th><th>serial</th><th>not before</th><th>not after</th><th>renews in</th><th>default</th></tr>
{{range .Certs}}<tr><td>{{.Provider}}</td><td>{{.Role}}</td><td>{{.Subject}}</td><td>{{.KeyAlgorithm}}</td><td>{{.Names}}</td><td><code>{{.Serial}}</code></td><td>{{.NotBefore}}</td><td>{{.NotAfter}}</td><td>{{.RenewsIn}}</td><td>{{if .IsDefault}}yes{{end}}</td></tr>
{{end}}</table>
<p><a href="/healthz?verbose">healthz</a> · <a href="/readyz?verbose">readyz</a> · <a href="/livez?verbose">livez</a> · <a href="/metrics">metrics</a></p>
</body></html>
`))

type statusRow struct {
	Provider, Role, Subject, KeyAlgorithm, Names, Serial, NotBefore, NotAfter, RenewsIn string
	IsDefault                                                                           bool
}

// statusPage shows, per provider, the certificate the server currently
// serves.
func statusPage(s *server.Serving, clk clock.PassiveClock) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		now := clk.Now()
		renew := renewers(s)
		var rows []statusRow
		for _, c := range s.Controller.Served() {
			renewsIn := "on change"
			if r, ok := renew[c.Provider]; ok {
				renewsIn = r.RenewAt().Sub(now).Round(time.Second).String()
			}
			rows = append(rows, statusRow{
				Provider: c.Provider, Role: c.Role, Subject: c.Subject, KeyAlgorithm: c.KeyAlgorithm, Names: strings.Join(c.Names, ", "),
				Serial: c.Serial, NotBefore: c.NotBefore.UTC().Format(time.RFC3339), NotAfter: c.NotAfter.UTC().Format(time.RFC3339),
				RenewsIn: renewsIn, IsDefault: c.IsDefault,
			})
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = statusTemplate.Execute(w, map[string]any{"Now": now.UTC().Format(time.RFC3339), "Certs": rows})
	})
}

// renewers maps provider names to providers that know when they renew
// (self-signed and loopback ones); file and Secret sources renew when their
// owner says so.
func renewers(s *server.Serving) map[string]interface{ RenewAt() time.Time } {
	out := map[string]interface{ RenewAt() time.Time }{}
	add := func(name string, p any) {
		if r, ok := p.(interface{ RenewAt() time.Time }); ok {
			out[name] = r
		}
		// The leaves of further key types renew with their provider's.
		if a, ok := p.(sni.AlternativesProvider); ok {
			for _, alt := range a.Alternatives() {
				if r, ok := alt.(interface{ RenewAt() time.Time }); ok {
					out[alt.Name()] = r
				}
			}
		}
	}
	if s.Serving != nil {
		add(s.Serving.Name(), s.Serving)
	}
	for _, p := range s.SNI {
		add(p.Name(), p)
	}
	return out
}
