package docfigures

import (
	"fmt"
	"slices"
	"strings"
)

// notRecorded fills the cells of a row whose benchmarks the recorded run
// does not have (an older bench.sh, or a family that failed).
const notRecorded = "not in the recorded run"

// rowGetter reads one table row's values and remembers whether any was
// missing, so that a row is either complete or says it was not measured.
type rowGetter struct {
	b       *Bench
	missing []string
}

func (g *rowGetter) v(name, unit string) Value {
	v, ok := g.b.Get(name, unit)
	if !ok {
		g.missing = append(g.missing, name+" "+unit)
	}
	return v
}

// row is one line of a figures table: what it measures, the benchmark
// that measures it and the goal; cells computes the figures.
type row struct {
	what, bench, goal string
	cells             func(g *rowGetter) []string
}

// table renders rows with the given figure columns; a row missing any of
// its values says notRecorded in its first figure column instead.
func table(b *Bench, columns []string, rows []row) string {
	var s strings.Builder
	head := append(append([]string{"what"}, columns...), "goal", "benchmark")
	s.WriteString("| " + strings.Join(head, " | ") + " |\n")
	s.WriteString(strings.Repeat("|---", len(head)) + "|\n")
	for _, r := range rows {
		g := &rowGetter{b: b}
		cells := r.cells(g)
		if len(g.missing) > 0 {
			cells = make([]string, len(columns))
			cells[0] = notRecorded
		}
		if len(cells) != len(columns) {
			panic(fmt.Sprintf("docfigures: row %q has %d cells for %d columns", r.what, len(cells), len(columns)))
		}
		line := append(append([]string{r.what}, cells...), r.goal, r.bench)
		s.WriteString("| " + strings.Join(line, " | ") + " |\n")
	}
	return s.String()
}

// benchHeader is the paragraph that opens each block from a bench.sh run:
// the command, the date and settings, the machine.
func benchHeader(b *Bench, what string) string {
	r := b.Run
	s := fmt.Sprintf("Measured by `hack/bench.sh` (`make bench`; `make docs-figures` runs it and rewrites this block) on %s: %s, `-count=%s`, %s, %s cores, %s.",
		r["date"], what, r["count"], r["cpu"], r["gomaxprocs"], r["go"])
	if r["count"] == "1" {
		s += " One run per benchmark: no intervals, and noisier than the default `-count=6`."
	} else {
		s += " Medians; every comparison is from the same run; BENCHMARKS.md has every result with benchstat's 95 % intervals."
	}
	return s + "\n"
}

// filePatterns are RotationPropagation's file operations and the words
// the table uses for them.
var filePatterns = []struct{ name, words string }{
	{"file-kubelet-symlink-swap", "kubelet `..data` swap"},
	{"file-in-place-rewrite", "in-place rewrite"},
	{"file-rename-over", "rename-over"},
	{"file-remove-recreate", "remove and recreate"},
}

// propagation writes one side's p50 / p99 per file pattern and what it
// missed, from RotationPropagation's {side}-p50-ms, -p99-ms and -missed.
func propagation(g *rowGetter, side, rotations string) string {
	var parts []string
	missed := 0.0
	for _, p := range filePatterns {
		name := "RotationPropagation/" + p.name
		p50, p99 := g.v(name, side+"-p50-ms"), g.v(name, side+"-p99-ms")
		m := g.v(name, side+"-missed")
		if m.V > 0 {
			missed += m.V
			parts = append(parts, fmt.Sprintf("%s: %s of %s missed", p.words, count(m.V), rotations))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s / %s", p.words, sig3(p50.V), millis(p99.V)))
	}
	s := strings.Join(parts, "; ")
	if missed == 0 {
		return s + "; none missed"
	}
	return s
}

// BenchBlock renders the block "bench": the in-process benchmarks of a
// hack/bench.sh run, evercert beside upstream and a static tls.Config.
func BenchBlock(b *Bench) string {
	const cfg = "GetConfigForClient/"
	rotations := b.Run["rotations"]
	rows := []row{
		{"`GetConfigForClient`", "`BenchmarkGetConfigForClient` (./sni/)", "0 allocs, >= 5x upstream", func(g *rowGetter) []string {
			e, u, s := g.v(cfg+"evercert", "sec/op"), g.v(cfg+"upstream", "sec/op"), g.v(cfg+"static", "sec/op")
			return []string{
				fmt.Sprintf("%s, %s, %s", seconds(e.V), bytes(g.v(cfg+"evercert", "B/op").V), allocs(g.v(cfg+"evercert", "allocs/op").V)),
				fmt.Sprintf("upstream %s, %s, %s (%s); static %s", seconds(u.V), bytes(g.v(cfg+"upstream", "B/op").V), allocs(g.v(cfg+"upstream", "allocs/op").V), times(u.V/e.V), seconds(s.V)),
			}
		}},
		handshakeRow("full TLS 1.3 handshake, ECDSA P-256", "ecdsa-p256", ">= 0.97"),
		handshakeRow("full TLS 1.3 handshake, RSA-2048", "rsa-2048", "reported"),
		{"selection with 1 / 100 / 10,000 / 100,000 SNI certificates", "`BenchmarkSNIScale` (./sni/)", "flat", func(g *rowGetter) []string {
			var ts, as []string
			zero := true
			for _, n := range []string{"1", "100", "10000", "100000"} {
				ts = append(ts, sig3(g.v("SNIScale/select/n="+n, "sec/op").V*1e9))
				a := g.v("SNIScale/select/n="+n, "allocs/op").V
				as = append(as, count(a))
				zero = zero && a == 0
			}
			a := "0 allocs at every size"
			if !zero {
				a = strings.Join(as, " / ") + " allocs"
			}
			return []string{strings.Join(ts, " / ") + " ns, " + a, ""}
		}},
		{"rebuild after 1 of 10,000 / 100,000 providers changed", "`BenchmarkSNIScale` (./sni/)", "< 20 ms at 100,000", func(g *rowGetter) []string {
			const r = "SNIScale/rebuild-one-changed"
			return []string{
				fmt.Sprintf("%s / %s (%s): only that provider is re-read, the snapshot is derived", seconds(g.v(r+"/n=10000", "sec/op").V), seconds(g.v(r+"/n=100000", "sec/op").V), bytes(g.v(r+"/n=100000", "B/op").V)),
				fmt.Sprintf("upstream at 10,000: %s, %s", seconds(g.v(r+"-upstream/n=10000", "sec/op").V), bytes(g.v(r+"-upstream/n=10000", "B/op").V)),
			}
		}},
		{"start-up, 100,000 SNI providers, to the first handshake; heap held per certificate (metrics reported together, the default)", "`BenchmarkSNIScale` (./sni/)", "<= 2 s", func(g *rowGetter) []string {
			const s = "SNIScale/startup/n=100000"
			return []string{millis(g.v(s, "ms-to-first-handshake").V) + "; " + bytes(g.v(s, "B/cert").V), ""}
		}},
		{"the same with a metric series per provider", "`BenchmarkSNIScale` (./sni/)", "reported", func(g *rowGetter) []string {
			const s = "SNIScale/startup-per-provider-metrics/n=100000"
			return []string{millis(g.v(s, "ms-to-first-handshake").V) + "; " + bytes(g.v(s, "B/cert").V), ""}
		}},
		{"file rotation to the first handshake presenting it, p50 / p99", "`BenchmarkRotationPropagation` (./sni/, `-benchtime " + rotations + "x`)", "p50 <= 5 ms, p99 <= 20 ms, every pattern", func(g *rowGetter) []string {
			return []string{propagation(g, "evercert", rotations), "upstream on the same files: " + propagation(g, "upstream", rotations)}
		}},
		{"self-signed renewal to served, p50 / p99", "`BenchmarkRotationPropagation` (./sni/)", "reported", func(g *rowGetter) []string {
			const r = "RotationPropagation/self-signed-renew"
			return []string{sig3(g.v(r, "p50-ms").V) + " / " + millis(g.v(r, "p99-ms").V), ""}
		}},
		{"two certificates for one name: selection", "`BenchmarkDualCertificate` (./sni/)", "0 allocs on the common path", func(g *rowGetter) []string {
			sel := func(n string) string {
				n = "DualCertificate/select/" + n
				return seconds(g.v(n, "sec/op").V) + ", " + allocs(g.v(n, "allocs/op").V)
			}
			return []string{fmt.Sprintf("one candidate %s; ECDSA client %s; RSA-only TLS 1.2 client %s (what `SupportsCertificate` allocates)", sel("one/ecdsa-client"), sel("two/ecdsa-client"), sel("two/rsa-client")), ""}
		}},
		{"two certificates for one name: handshake", "`BenchmarkDualCertificate` (./sni/)", "reported", func(g *rowGetter) []string {
			h := func(side, client string) string {
				return seconds(g.v("DualCertificate/handshake/"+side+"/"+client, "sec/op").V)
			}
			return []string{
				fmt.Sprintf("ECDSA client %s, RSA-only client %s", h("evercert", "ecdsa-client"), h("evercert", "rsa-client")),
				fmt.Sprintf("static config holding both: %s / %s", h("static", "ecdsa-client"), h("static", "rsa-client")),
			}
		}},
		{"CA + leaf generation", "`BenchmarkSelfSignedGenerate` (./authority/)", "< 5 ms", func(g *rowGetter) []string {
			return []string{
				seconds(g.v("SelfSignedGenerate/evercert/ecdsa-p256", "sec/op").V) + " (ECDSA P-256)",
				"upstream certutil (2x RSA-2048) " + seconds(g.v("SelfSignedGenerate/upstream/rsa-2048", "sec/op").V),
			}
		}},
		{"loopback set-up", "`BenchmarkLoopbackSetup` (./loopback/)", ">= 20x", func(g *rowGetter) []string {
			e, u := g.v("LoopbackSetup/evercert", "sec/op"), g.v("LoopbackSetup/upstream", "sec/op")
			return []string{seconds(e.V), fmt.Sprintf("upstream `SecureServingOptionsWithLoopback.ApplyTo` %s (%s)", seconds(u.V), times(u.V/e.V))}
		}},
		{"requests/s through the loopback clientset", "`BenchmarkLoopbackRequests` (./loopback/)", ">= 0.95", func(g *rowGetter) []string {
			e, u := g.v("LoopbackRequests/evercert", "req/s"), g.v("LoopbackRequests/upstream", "req/s")
			return []string{count(e.V) + ci(e), fmt.Sprintf("upstream config %s%s (ratio %s)", count(u.V), ci(u), ratio(e.V/u.V))}
		}},
		{"cabundle publisher, 1,000 webhook configurations selected by label (and 1,000 not)", "`BenchmarkPublisherScale` (./cabundle/, `-benchtime 1x`)", "requests O(targets), 0 at rest", func(g *rowGetter) []string {
			const p = "PublisherScale"
			return []string{fmt.Sprintf("%s requests to publish (%s writes); %s per resync at rest; %s per rotation; heap held %s MiB (%s per target)",
				count(g.v(p, "requests-to-publish").V), count(g.v(p, "writes-to-publish").V), count(g.v(p, "requests-per-resync").V),
				count(g.v(p, "requests-per-rotation").V), sig3(g.v(p, "heap-MiB").V), bytes(g.v(p, "B/target").V)), ""}
		}},
	}
	return benchHeader(b, "`-benchtime="+b.Run["benchtime"]+"` unless the row says otherwise") + "\n" +
		table(b, []string{"evercert", "baseline"}, rows)
}

// handshakeRow is BenchmarkHandshake for one key type: evercert's
// controller against a static config with the same certificate.
func handshakeRow(what, key, goal string) row {
	return row{what, "`BenchmarkHandshake` (./sni/)", goal, func(g *rowGetter) []string {
		e, s := g.v("Handshake/evercert/"+key, "sec/op"), g.v("Handshake/static/"+key, "sec/op")
		return []string{seconds(e.V), fmt.Sprintf("static `tls.Config` %s (ratio %s)", seconds(s.V), ratio(s.V/e.V))}
	}}
}

// servers are test/handshake's five server processes in the order the
// tables name them, with the words they use.
var servers = []struct{ name, words string }{
	{"evercert", "example server"},
	{"example-app", "example-app"},
	{"library", "library"},
	{"upstream", "upstream"},
	{"static", "static"},
}

// HandshakeBlock renders the block "handshake": test/handshake's five
// server processes measured from outside.
func HandshakeBlock(b *Bench) string {
	rows := []row{
		{"full TLS 1.3 handshakes: handshakes/s against static", "`BenchmarkServerHandshake` (./test/handshake/)", "example server >= 0.97", func(g *rowGetter) []string {
			return []string{serverRatios(g, "ServerHandshake", "static")}
		}},
		{"handshakes with a client certificate: handshakes/s against upstream's controller", "`BenchmarkServerHandshakeMTLS` (./test/handshake/)", ">= 1.0", func(g *rowGetter) []string {
			return []string{serverRatios(g, "ServerHandshakeMTLS", "upstream")}
		}},
		{"TLS 1.3 resumption while an unrelated SNI certificate rotates: fraction resumed", "`BenchmarkServerResumption` (./test/handshake/, `-benchtime " + b.Run["resumptions"] + "x`)", "the same for all five", func(g *rowGetter) []string {
			var parts []string
			for _, s := range servers {
				parts = append(parts, fmt.Sprintf("%s %s", s.words, fmt3(g.v("ServerResumption", s.name+"-resumed").V)))
			}
			return []string{strings.Join(parts, "; ")}
		}},
	}
	return benchHeader(b, "`-benchtime="+b.Run["handshakes"]+"x` unless the row says otherwise") + "\n" +
		table(b, []string{"ratio"}, rows)
}

// serverRatios writes each server's ratio of handshakes/s against one of
// them, as BenchmarkServerHandshake* report it ("library/upstream").
func serverRatios(g *rowGetter, bench, against string) string {
	var parts []string
	for _, s := range servers {
		if s.name == against {
			continue
		}
		v, ok := g.b.Get(bench, s.name+"/"+against)
		if !ok {
			// The benchmarks report the ratios their goals name, not
			// every pair.
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s%s", s.words, fmt3(v.V), ci(v)))
	}
	if len(parts) == 0 {
		g.missing = append(g.missing, bench+" */"+against)
	}
	return strings.Join(parts, "; ")
}

// fmt3 writes a ratio or fraction near 1 with three decimals.
func fmt3(x float64) string { return fmt.Sprintf("%.3f", x) }

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
