package docfigures

import (
	"strings"
	"testing"
)

// oneRun is benchstat's output for a -count=1 run on one core: no
// interval ("± ∞" and a footnote) and no "-N" suffix on the names, so a
// name's own "-2048" must survive.
const oneRun = `goos: linux
pkg: github.com/evercert/evercert/sni
                                 │ tmp/bench/raw.txt │
                                 │      sec/op       │
Handshake/evercert/rsa-2048        1.529m ± ∞ ¹
GetConfigForClient/upstream        160.4n ± ∞ ¹
geomean                            15.66µ
¹ need >= 6 samples for confidence interval at level 0.95

                                 │ tmp/bench/raw.txt │
                                 │       B/op        │
SNIScale/startup/n=100000          1.175Gi ± ∞ ¹
`

func TestParseBenchOneRunOneCore(t *testing.T) {
	b, err := ParseBench("gomaxprocs: 1\n", oneRun)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, unit string
		want       float64
	}{
		{"Handshake/evercert/rsa-2048", "sec/op", 1.529e-3},
		{"GetConfigForClient/upstream", "sec/op", 160.4e-9},
		{"SNIScale/startup/n=100000", "B/op", 1.175 * (1 << 30)},
	} {
		v, ok := b.Get(c.name, c.unit)
		if !ok {
			t.Errorf("%s %s: not parsed", c.name, c.unit)
			continue
		}
		if d := v.V/c.want - 1; d > 1e-9 || d < -1e-9 || v.CI != -1 {
			t.Errorf("%s %s = %v ± %v, want %v with no interval", c.name, c.unit, v.V, v.CI, c.want)
		}
	}
	if _, ok := b.Get("geomean", "sec/op"); ok {
		t.Error("the geomean row was taken for a benchmark")
	}
}

func TestParseBenchCutsTheProcsSuffix(t *testing.T) {
	b, err := ParseBench("gomaxprocs: 2\n", strings.ReplaceAll(strings.ReplaceAll(oneRun, "rsa-2048 ", "rsa-2048-2"), "upstream ", "upstream-2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.Get("Handshake/evercert/rsa-2048", "sec/op"); !ok {
		t.Error("Handshake/evercert/rsa-2048-2 was not read as Handshake/evercert/rsa-2048")
	}
	if _, err := ParseBench("count: 1\n", oneRun); err == nil {
		t.Error("a run record without gomaxprocs was accepted")
	}
}

func TestBenchBlockSaysWhatIsMissing(t *testing.T) {
	b, err := ParseBench("gomaxprocs: 1\ncount: 1\n", oneRun)
	if err != nil {
		t.Fatal(err)
	}
	block := BenchBlock(b)
	for _, want := range []string{
		"| full TLS 1.3 handshake, RSA-2048 | " + notRecorded + " |  |", // the static half is missing
		"One run per benchmark",
	} {
		if !strings.Contains(block, want) {
			t.Errorf("the block lacks %q:\n%s", want, block)
		}
	}
}

func TestSpliceReplacesOnlyBetweenMarkers(t *testing.T) {
	doc := "# T\n\nprose quoting `<!-- figures:a begin -->`\n" + Begin("a") + End("a") + "middle\n" + Begin("b") + "old\nlines\n" + End("b") + "tail\n"
	got, err := Splice(doc, map[string]string{"a": "A\n", "b": "B\n"})
	if err != nil {
		t.Fatal(err)
	}
	want := "# T\n\nprose quoting `<!-- figures:a begin -->`\n" + Begin("a") + "A\n" + End("a") + "middle\n" + Begin("b") + "B\n" + End("b") + "tail\n"
	if got != want {
		t.Errorf("Splice:\n%s\nwant:\n%s", got, want)
	}
	blocks, err := Extract(got)
	if err != nil || blocks["a"] != "A\n" || blocks["b"] != "B\n" {
		t.Errorf("Extract(Splice(...)) = %q, %v", blocks, err)
	}
	if _, err := Splice(doc, map[string]string{"a": "A\n"}); err == nil {
		t.Error("a marked block with nothing to render it from was accepted")
	}
	if _, err := Splice(doc, map[string]string{"a": "A\n", "b": "B\n", "c": "C\n"}); err == nil {
		t.Error("a rendered block without markers was accepted")
	}
	if _, err := Extract(Begin("a") + "x\n"); err == nil {
		t.Error("a block without its end marker was accepted")
	}
}

func TestSoakBlock(t *testing.T) {
	s, err := ParseSoak(`date: 2026-11-29
command: make soak-run

fault_test.go:436: api-429: 24 requests in 4m30s of 429 faults (5.3 per simulated minute); busiest loop past the ramp: r1 secrets, 1.0/min
report_test.go:102: soak report fault/pause-1.5-ca: simulated 33d12h in 32 steps (paused 18d), rotations 78 (longest wait of a successor 12h0m0s), handshakes 309, API calls 287 (8.6/simulated day; peak 0.0/min in fault stretches), unsafe rotations 4, hot loops 0, failures 0 (expected: 6 after unsafe rotations, 0 in the negative control), events {}, goroutines 3 -> 3, heap in use 9320 KiB -> 9744 KiB
fault_test.go:88: soak report faults: 34 scenarios x 1 cycles, simulated 420d14h (1.2 years), rotations 1691, handshakes 12954, API calls 8299, unsafe rotations 4, hot loops 0, failures 0
--- PASS: TestSoakFaults (88.35s)
`)
	if err != nil {
		t.Fatal(err)
	}
	block := SoakBlock(s)
	for _, want := range []string{
		"(`make soak-run`) on 2026-11-29",
		"1m28s, passed): 34 scenarios x 1 cycle, 1.2 simulated years, 1,691 rotations, 12,954 real handshakes, 8,299 API calls, 0 hot loops, 0 failures; 4 unsafe rotations",
		"pause-1.5-ca (4)",
		"429 1.0",
	} {
		if !strings.Contains(block, want) {
			t.Errorf("the block lacks %q:\n%s", want, block)
		}
	}
}
