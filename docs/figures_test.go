package docs_test

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/evercert/evercert/internal/docfigures"
)

// figuresCommand is what a failure of TestFiguresBlocks tells the reader
// to run: re-measure, or re-render the record after a change of the
// renderer.
const figuresCommand = "make docs-figures (re-measure), or go run ./hack/figures (re-render docs/figures)"

// TestFiguresBlocks renders the blocks of docs/measured.md between
// "<!-- figures:NAME begin -->" and "<!-- figures:NAME end -->" from the
// outputs make docs-figures recorded in docs/figures and fails, naming the
// block and its first differing line, when the document differs: a figure
// edited by hand, or a record changed without re-rendering.
func TestFiguresBlocks(t *testing.T) {
	in, err := docfigures.Load("figures")
	if err != nil {
		t.Fatal(err)
	}
	want := docfigures.Blocks(in)
	b, err := os.ReadFile("measured.md")
	if err != nil {
		t.Fatal(err)
	}
	have, err := docfigures.Extract(string(b))
	if err != nil {
		t.Fatalf("docs/measured.md: %v", err)
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		h, ok := have[name]
		if !ok {
			t.Errorf("docs/measured.md has no %q block, which docs/figures records the figures of", name)
			continue
		}
		if h != want[name] {
			t.Errorf("docs/measured.md: the figures:%s block differs from what docs/figures records; run\n\t%s\n%s", name, figuresCommand, firstDifference(h, want[name], "record"))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(have)) {
		if _, ok := want[name]; !ok {
			t.Errorf("docs/measured.md: the figures:%s block has no recorded run in docs/figures to be rendered from", name)
		}
	}
}

// figure is the rule TestFiguresNameTheirCommand enforces: a number (a
// range "30–100" included) followed by a unit of time (ns, µs, ms, s,
// min), of memory (B, KiB, MiB, GiB), allocations, a percentage, a ratio
// written "151x", a rate (req/s, handshakes/s) or a count of what a run
// did: requests, handshakes, rotations, writes, calls, creates,
// admissions, failures, failed ... .
var figure = regexp.MustCompile(`(?:^|[^\w.\-/=])(\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?\d[\d,]*(?:\.\d+)?)?(?:x\b|\s?(?:%|(?:ns|µs|us|ms|s|min|B|KiB|MiB|GiB|allocs?|allocations?|req/s|handshakes/s|requests|handshakes|rotations|writes|calls|creates|admissions|failures|failed \w+)\b)))`)

// namesCommand is what counts as naming the command that produced a
// figure: a make target, go test or go run, a script of hack/, or a
// test, benchmark or fuzz function by name.
var namesCommand = regexp.MustCompile("`make [\\w-]+|`go (?:test|run)\\b|`hack/[\\w./-]+|\\b(?:Test|Benchmark|Fuzz)[A-Z]\\w*")

// sectionCommand opens a paragraph that names the command for every
// figure of its section (from one heading to the next).
var sectionCommand = regexp.MustCompile(`^Commands?:`)

// codeSpan is inline code, whose digits are flags and values, not figures.
var codeSpan = regexp.MustCompile("`[^`]*`")

// textUnit is a paragraph, a list item or a table row of a document, with
// the section it is in and, for a row, its table's caption (the paragraph
// right above the table).
type textUnit struct {
	line    int
	text    string
	section int
	caption string
}

// textUnits splits a Markdown document into paragraphs, list items (with
// their continuation lines) and table rows, skipping fenced code and the
// generated reference tables ("<!-- generated: NAME -->" to
// "<!-- end -->"), which hold the code's defaults, not measurements.
func textUnits(t *testing.T, file string) []textUnit {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var units []textUnit
	var cur *textUnit
	section, lastPara := 0, ""
	fenced, generated := false, false
	flush := func() {
		if cur != nil {
			units = append(units, *cur)
			if !strings.HasPrefix(cur.text, "|") && !strings.HasPrefix(cur.text, "- ") {
				lastPara = cur.text
			}
			cur = nil
		}
	}
	listItem := regexp.MustCompile(`^(?:[-*]|\d+\.) `)
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			flush()
			fenced = !fenced
			continue
		case fenced:
			continue
		case strings.HasPrefix(trimmed, "<!-- generated: "):
			flush()
			generated = true
			continue
		case trimmed == "<!-- end -->":
			generated = false
			continue
		case generated:
			continue
		case trimmed == "":
			flush()
			continue
		case strings.HasPrefix(trimmed, "#"):
			flush()
			section++
			lastPara = ""
			continue
		case strings.HasPrefix(trimmed, "|"):
			flush()
			units = append(units, textUnit{line: i + 1, text: trimmed, section: section, caption: lastPara})
			continue
		case listItem.MatchString(trimmed) && !strings.HasPrefix(line, "  "):
			flush()
			cur = &textUnit{line: i + 1, text: "- " + trimmed, section: section}
			continue
		}
		if cur == nil {
			cur = &textUnit{line: i + 1, text: trimmed, section: section}
		} else {
			cur.text += " " + trimmed
		}
	}
	flush()
	return units
}

// notFigure is an entry of docs/figures/not-figures.txt: a figure's text
// in a file (or "*", the whole file) that names no command, and why it is
// not a measurement.
type notFigure struct {
	file, text, why string
	used            bool
}

func notFigures(t *testing.T) []*notFigure {
	b, err := os.ReadFile("figures/not-figures.txt")
	if err != nil {
		t.Fatal(err)
	}
	var out []*notFigure
	for i, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, " | ")
		if len(parts) != 3 || strings.TrimSpace(parts[2]) == "" {
			t.Errorf("docs/figures/not-figures.txt:%d: want FILE | FIGURE | WHY, got %q", i+1, line)
			continue
		}
		out = append(out, &notFigure{file: strings.TrimSpace(parts[0]), text: strings.TrimSpace(parts[1]), why: parts[2]})
	}
	return out
}

// TestFiguresNameTheirCommand fails for each figure in README.md and
// docs/*.md (see figure) whose paragraph, list item or table row names no
// command (see namesCommand), unless the table's caption or a paragraph
// of its section opening with "Command:" or "Commands:" names one, or
// docs/figures/not-figures.txt lists it with the reason it is not a
// measurement (a default, a constant, a bound derived in the text, a
// simulator setting). An entry of that list that matches nothing fails
// too, so the list cannot outlive what it excuses.
func TestFiguresNameTheirCommand(t *testing.T) {
	allow := notFigures(t)
	for _, file := range markdownFiles(t) {
		name := strings.TrimPrefix(file, "../")
		if !strings.HasPrefix(file, "../") {
			name = "docs/" + file
		}
		units := textUnits(t, file)
		sections := map[int]bool{}
		for _, u := range units {
			if sectionCommand.MatchString(u.text) && namesCommand.MatchString(u.text) {
				sections[u.section] = true
			}
		}
		for _, u := range units {
			if namesCommand.MatchString(u.text) || sections[u.section] ||
				(strings.HasPrefix(u.text, "|") && namesCommand.MatchString(u.caption)) {
				continue
			}
			var bare []string
			for _, m := range figure.FindAllStringSubmatch(codeSpan.ReplaceAllString(u.text, "``"), -1) {
				excused := false
				for _, a := range allow {
					if a.file == name && (a.text == "*" || a.text == m[1]) {
						a.used, excused = true, true
					}
				}
				if !excused {
					bare = append(bare, m[1])
				}
			}
			if len(bare) > 0 {
				t.Errorf("%s:%d: figures that name no command: %q; name the make target, go test command or test that measured them in the same paragraph, row or list item, or list them in docs/figures/not-figures.txt with why they are not measurements\n\t%s", name, u.line, bare, u.text)
			}
		}
	}
	for _, a := range allow {
		if !a.used {
			t.Errorf("docs/figures/not-figures.txt: %s | %s matches no figure without a command; remove it", a.file, a.text)
		}
	}
}
