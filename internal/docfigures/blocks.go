package docfigures

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// The files of a recorded run, in the directory make docs-figures writes
// them to (docs/figures).
const (
	// BenchRunFile holds hack/bench.sh's settings (its tmp/bench/run.txt).
	BenchRunFile = "bench-run.txt"
	// BenchFile holds benchstat's summary of the run (tmp/bench/all.txt).
	BenchFile = "bench.txt"
	// SoakFile holds the soak run's settings and its report lines.
	SoakFile = "soak.txt"
)

// Inputs are the recorded outputs the blocks are rendered from; a nil
// field was not recorded.
type Inputs struct {
	Bench *Bench
	Soak  *Soak
}

// Load reads the recorded outputs in dir. A missing soak record leaves
// Soak nil; the bench record is required.
func Load(dir string) (Inputs, error) {
	var in Inputs
	run, err := os.ReadFile(filepath.Join(dir, BenchRunFile))
	if err != nil {
		return in, fmt.Errorf("recorded bench run: %w", err)
	}
	stat, err := os.ReadFile(filepath.Join(dir, BenchFile))
	if err != nil {
		return in, fmt.Errorf("recorded bench run: %w", err)
	}
	if in.Bench, err = ParseBench(string(run), string(stat)); err != nil {
		return in, fmt.Errorf("%s: %w", filepath.Join(dir, BenchFile), err)
	}
	soak, err := os.ReadFile(filepath.Join(dir, SoakFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return in, fmt.Errorf("recorded soak run: %w", err)
	default:
		if in.Soak, err = ParseSoak(string(soak)); err != nil {
			return in, fmt.Errorf("%s: %w", filepath.Join(dir, SoakFile), err)
		}
	}
	return in, nil
}

// Blocks renders every block the inputs allow, by name.
func Blocks(in Inputs) map[string]string {
	out := map[string]string{}
	if in.Bench != nil {
		out["bench"] = BenchBlock(in.Bench)
		out["handshake"] = HandshakeBlock(in.Bench)
	}
	if in.Soak != nil {
		out["soak"] = SoakBlock(in.Soak)
	}
	return out
}

// Begin and End are the lines around block name in a document; what is
// between them is the generator's, everything else is hand-written.
func Begin(name string) string { return "<!-- figures:" + name + " begin -->\n" }

// End is the line after block name; see Begin.
func End(name string) string { return "<!-- figures:" + name + " end -->\n" }

// marker is a begin or end line of a block; a marker must be a line of
// its own, so that prose may quote one.
var marker = regexp.MustCompile(`(?m)^<!-- figures:(\S+) (begin|end) -->$`)

// Extract returns the blocks of doc by name, and an error for a begin
// marker without its end, an end without its begin, or a block twice.
func Extract(doc string) (map[string]string, error) {
	out := map[string]string{}
	open, start := "", 0
	for _, m := range marker.FindAllStringSubmatchIndex(doc, -1) {
		name, kind := doc[m[2]:m[3]], doc[m[4]:m[5]]
		switch {
		case kind == "begin" && open != "":
			return nil, fmt.Errorf("block %s: begins inside block %s", name, open)
		case kind == "begin":
			if _, dup := out[name]; dup {
				return nil, fmt.Errorf("block %s: twice", name)
			}
			open, start = name, m[1]+1
		case name != open:
			return nil, fmt.Errorf("block %s: an end marker without its begin", name)
		default:
			out[name] = doc[start:m[0]]
			open = ""
		}
	}
	if open != "" {
		return nil, fmt.Errorf("block %s: no %q", open, strings.TrimSpace(End(open)))
	}
	return out, nil
}

// Splice writes blocks into doc between their markers. Every block must
// have its markers, and every marked block a rendering.
func Splice(doc string, blocks map[string]string) (string, error) {
	have, err := Extract(doc)
	if err != nil {
		return "", err
	}
	for name := range have {
		if _, ok := blocks[name]; !ok {
			return "", fmt.Errorf("block %s: nothing recorded to render it from", name)
		}
	}
	for _, name := range sortedKeys(blocks) {
		if _, ok := have[name]; !ok {
			return "", fmt.Errorf("block %s: no %q line", name, strings.TrimSpace(Begin(name)))
		}
	}
	// Extract checked the markers pair up: replace what lies between each
	// begin line and the end line after it.
	var out strings.Builder
	last := 0 // where the text to keep starts: 0, then each end line
	for _, m := range marker.FindAllStringSubmatchIndex(doc, -1) {
		name := doc[m[2]:m[3]]
		if doc[m[4]:m[5]] == "begin" {
			out.WriteString(doc[last:m[0]] + Begin(name) + blocks[name])
		} else {
			last = m[0]
		}
	}
	out.WriteString(doc[last:])
	doc = out.String()
	return doc, nil
}
