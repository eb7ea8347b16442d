// Package docfigures holds the figures docs/measured.md quotes: it parses
// the recorded outputs of the commands that measured them (benchstat's
// tables of a hack/bench.sh run, the soak's report lines) and renders the
// marked blocks of the document from them. make docs-figures re-measures
// and records new outputs (hack/figures); go test ./docs/ re-renders the
// recorded ones and fails when a block differs. Nothing here measures.
//
// See docs/architecture.md for how the packages fit together.
package docfigures

import (
	"bufio"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Value is one median of benchstat's summary table.
type Value struct {
	// V is the median in the unit's base (seconds for sec/op, bytes for
	// B/op, the plain number for any other unit).
	V float64
	// CI is benchstat's 95 % interval in percent, or -1 when benchstat
	// gave none (fewer than 6 runs: "± ∞").
	CI float64
}

// Bench is one hack/bench.sh run: its settings (tmp/bench/run.txt) and
// the medians of benchstat's summary of it (tmp/bench/all.txt).
type Bench struct {
	// Run holds run.txt's "key: value" lines: date, count, benchtime,
	// gomaxprocs, cpu, go, rotations, handshakes, resumptions.
	Run map[string]string
	// values is keyed by benchmark name (without the GOMAXPROCS suffix)
	// and unit, e.g. {"GetConfigForClient/evercert", "sec/op"}.
	values map[benchKey]Value
}

type benchKey struct{ name, unit string }

// Get returns the median of benchmark name in unit and whether the run
// has it.
func (b *Bench) Get(name, unit string) (Value, bool) {
	v, ok := b.values[benchKey{name, unit}]
	return v, ok
}

// ParseRun parses "key: value" lines; blank lines and lines starting with
// '#' are skipped.
func ParseRun(text string) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("line %d %q: want key: value", i+1, line)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}

// benchRow is a data row of a benchstat table: name, median with an SI or
// binary suffix, and "± N%" or "± ∞", then an optional footnote mark.
var benchRow = regexp.MustCompile(`^(\S+)\s+([0-9.]+)(Ki|Mi|Gi|Ti|n|µ|u|m|k|M|G|T)?\s+±\s+(∞|[0-9.]+%)`)

var suffixes = map[string]float64{
	"": 1, "n": 1e-9, "µ": 1e-6, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
}

// ParseBench parses run.txt (the run's settings) and benchstat's default
// output for one input file (the text hack/bench.sh writes to
// tmp/bench/all.txt): tables of one unit each, headed by two "│" lines,
// the file name and the unit. The GOMAXPROCS suffix ("-2") is cut from
// the names, using run.txt's gomaxprocs.
func ParseBench(run, stat string) (*Bench, error) {
	meta, err := ParseRun(run)
	if err != nil {
		return nil, fmt.Errorf("bench run settings: %w", err)
	}
	procs := meta["gomaxprocs"]
	if procs == "" {
		return nil, fmt.Errorf("bench run settings: no gomaxprocs line")
	}
	b := &Bench{Run: meta, values: map[benchKey]Value{}}
	var unit string
	header := 0 // "│" lines seen in a row: the second names the unit
	sc := bufio.NewScanner(strings.NewReader(stat))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.Contains(line, "│") {
			header++
			if header == 2 {
				unit = strings.TrimSpace(strings.Trim(strings.TrimSpace(line), "│"))
			}
			continue
		}
		header = 0
		m := benchRow.FindStringSubmatch(line)
		if m == nil || m[1] == "geomean" {
			continue
		}
		if unit == "" {
			return nil, fmt.Errorf("benchstat line %d: a row before any table header: %q", n, line)
		}
		x, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, fmt.Errorf("benchstat line %d: %w", n, err)
		}
		ci := -1.0
		if m[4] != "∞" {
			if ci, err = strconv.ParseFloat(strings.TrimSuffix(m[4], "%"), 64); err != nil {
				return nil, fmt.Errorf("benchstat line %d: %w", n, err)
			}
		}
		name := m[1]
		if procs != "1" {
			name = strings.TrimSuffix(name, "-"+procs)
		}
		b.values[benchKey{name, unit}] = Value{V: x * suffixes[m[3]], CI: ci}
	}
	if len(b.values) == 0 {
		return nil, fmt.Errorf("benchstat output holds no result")
	}
	return b, sc.Err()
}
