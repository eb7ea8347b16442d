package docfigures

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// Extract returns the blocks of doc by name, and an error for a begin
// marker without its end.
func Extract(doc string) (map[string]string, error) {
	out := map[string]string{}
	rest := doc
	for {
		_, after, ok := strings.Cut(rest, "<!-- figures:")
		if !ok {
			return out, nil
		}
		name, _, ok := strings.Cut(after, " begin -->\n")
		if !ok || strings.ContainsAny(name, " \n") {
			return nil, fmt.Errorf("a figures marker that is not %q", Begin("NAME"))
		}
		body, after, ok := strings.Cut(after[len(name)+len(" begin -->\n"):], End(name))
		if !ok {
			return nil, fmt.Errorf("block %s: no %q", name, strings.TrimSpace(End(name)))
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("block %s: twice", name)
		}
		out[name] = body
		rest = after
	}
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
		before, rest, ok := strings.Cut(doc, Begin(name))
		if !ok {
			return "", fmt.Errorf("block %s: no %q marker", name, strings.TrimSpace(Begin(name)))
		}
		_, after, _ := strings.Cut(rest, End(name))
		doc = before + Begin(name) + blocks[name] + End(name) + after
	}
	return doc, nil
}
