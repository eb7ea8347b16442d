package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/evercert/evercert/server"
)

// markdownFiles are the documents the checks below read: the README and
// every page of docs/, as paths relative to this directory.
func markdownFiles(t *testing.T) []string {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"../README.md"}, pages...)
}

// prose returns the lines of a Markdown document outside fenced code
// blocks, where a "# comment" is not a heading and a [x](y) not a link.
func prose(t *testing.T, file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fenced := false
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, strings.TrimRight(line, "\n"))
		}
	}
	return out
}

// anchors returns the GitHub anchors of a document's headings: lower case,
// punctuation other than '-' and '_' dropped, spaces made '-', and "-N"
// appended to the Nth repeat of an anchor.
func anchors(t *testing.T, file string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(t, file) {
		text, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		text = strings.TrimLeft(text, "#")
		if !strings.HasPrefix(text, " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(text)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestRelativeLinks checks that every relative link of README.md and
// docs/*.md leads to a file that exists and, with a #fragment into a
// Markdown file, to a heading of that file.
func TestRelativeLinks(t *testing.T) {
	for _, file := range markdownFiles(t) {
		for i, line := range prose(t, file) {
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				p, frag, _ := strings.Cut(target, "#")
				resolved := file
				if p != "" {
					resolved = filepath.Join(filepath.Dir(file), filepath.FromSlash(p))
					if _, err := os.Stat(resolved); err != nil {
						t.Errorf("%s, line %d of its prose: link %q: %v", file, i+1, target, err)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(resolved, ".md") && !anchors(t, resolved)[frag] {
					t.Errorf("%s, line %d of its prose: link %q: %s has no heading with anchor #%s", file, i+1, target, resolved, frag)
				}
			}
		}
	}
}

var metricRE = regexp.MustCompile(`\bevercert_[a-z0-9_]*[a-z0-9]\b`)

// TestDocumentedMetricsExist checks that every evercert_ metric named
// anywhere in README.md or docs/ is one the registry has (the README once
// listed a metric table that left one out; a renamed metric must not
// survive in prose either).
func TestDocumentedMetricsExist(t *testing.T) {
	known := map[string]bool{}
	for _, m := range describeMetrics(t) {
		known[m.name] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			known[m.name+suffix] = true
		}
	}
	for _, file := range markdownFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range slices.Compact(slices.Sorted(slices.Values(metricRE.FindAllString(string(b), -1)))) {
			if !known[name] {
				t.Errorf("%s names metric %s, which internal/certmetrics does not register", file, name)
			}
		}
	}
}

// exampleFlags are flags the notes in reference.md describe that are not
// server.Options': the example programs' own and component-base logging's.
var exampleFlags = []string{"loopback-validity", "v", "logging-format"}

// TestFlagNotesNameRealFlags checks that each row of the hand-written flag
// notes in reference.md names a flag server.Options registers (or one of
// exampleFlags), so that a renamed flag cannot keep its old notes.
func TestFlagNotesNameRealFlags(t *testing.T) {
	fs := pflag.NewFlagSet("evercert", pflag.ContinueOnError)
	server.NewOptions().AddFlags(fs)
	b, err := os.ReadFile("reference.md")
	if err != nil {
		t.Fatal(err)
	}
	_, notes, ok := strings.Cut(string(b), "\n### Flag notes\n")
	if !ok {
		t.Fatal(`docs/reference.md has no "### Flag notes" section`)
	}
	notes, _, _ = strings.Cut(notes, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`(?:, `--([a-z0-9-]+)`)?")
	rows := row.FindAllStringSubmatch(notes, -1)
	if len(rows) == 0 {
		t.Fatal("the flag notes have no rows")
	}
	for _, m := range rows {
		for _, name := range m[1:] {
			if name != "" && fs.Lookup(name) == nil && !slices.Contains(exampleFlags, name) {
				t.Errorf("docs/reference.md's flag notes describe --%s, which server.Options does not register", name)
			}
		}
	}
}

// TestRunbookPerAlert checks that every alert of
// deploy/prometheus/rules.yaml has a runbook heading in docs/operating.md.
func TestRunbookPerAlert(t *testing.T) {
	rules, err := os.ReadFile("../deploy/prometheus/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\w+)\s*$`).FindAllStringSubmatch(string(rules), -1)
	if len(alerts) == 0 {
		t.Fatal("deploy/prometheus/rules.yaml has no alert")
	}
	have := anchors(t, "operating.md")
	for _, a := range alerts {
		if !have[strings.ToLower(a[1])] {
			t.Errorf("alert %s has no runbook: add a heading %q to docs/operating.md", a[1], "#### "+a[1])
		}
	}
}

// TestREADMEBlocksAreFromEmbedding checks that every line of every Go
// block of README.md is a line of docs/embedding.md, whose recipes the
// packages' tests keep identical to compiled code (for example
// TestREADMERecipesAreCompiled in controllerruntime, and
// TestREADMEWebhookRecipeIsCompiled in cabundle): the README shows
// excerpts, and an excerpt cannot drift from its recipe.
func TestREADMEBlocksAreFromEmbedding(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	embedding, err := os.ReadFile("embedding.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]bool{}
	for l := range strings.Lines(string(embedding)) {
		lines[strings.TrimRight(l, "\n")] = true
	}
	blocks := 0
	for rest := string(readme); ; {
		_, after, ok := strings.Cut(rest, "```go\n")
		if !ok {
			break
		}
		block, tail, ok := strings.Cut(after, "```\n")
		if !ok {
			t.Fatal("README.md: unterminated Go block")
		}
		blocks++
		for l := range strings.Lines(block) {
			if l = strings.TrimRight(l, "\n"); l != "" && !lines[l] {
				t.Errorf("README.md Go block %d: line %q is not a line of docs/embedding.md", blocks, l)
			}
		}
		rest = tail
	}
	if blocks < 3 {
		t.Errorf("README.md has %d Go blocks, want the three embeddings", blocks)
	}
}

// citedTestRE matches a test or benchmark named in a document, in
// backquotes, with an optional subtest path: the security model and the
// operating pages back their claims with these names.
var citedTestRE = regexp.MustCompile("`((?:Test|Benchmark)[A-Z][A-Za-z0-9_]*)(?:/[^`]*)?`")

// TestCitedTestsExist checks that every test or benchmark a document names
// is a function of some _test.go file of the repository (test/migrate's
// module included), so that a claim cannot keep citing a test that was
// renamed or removed.
func TestCitedTestsExist(t *testing.T) {
	defined := map[string]bool{}
	funcRE := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark)[A-Za-z0-9_]+)\(`)
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "tmp" || d.Name() == "tools" && filepath.Base(filepath.Dir(path)) == "hack" || strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcRE.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !defined["TestCitedTestsExist"] {
		t.Fatal("the walk found no test functions: it did not read this repository")
	}
	for _, file := range markdownFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range citedTestRE.FindAllStringSubmatch(string(b), -1) {
			if !defined[m[1]] {
				t.Errorf("%s cites %s, which no _test.go file defines", file, m[1])
			}
		}
	}
}
