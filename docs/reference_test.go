// Package docs_test keeps docs/ true to the code. The tables of
// docs/reference.md between "<!-- generated: NAME -->" and "<!-- end -->"
// are generated from the code (the server flag set, the metrics registry,
// the exported constants), and every relative link in README.md and docs/
// must lead to a file and heading that exist. Nothing here starts a
// process or a server: the whole package runs in well under a second.
package docs_test

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/evercert/evercert/metrics"
	"github.com/evercert/evercert/server"
)

// update rewrites the generated blocks of docs/reference.md instead of
// comparing them, the way golden files are refreshed.
var update = flag.Bool("update", false, "rewrite the generated tables of docs/reference.md from the code")

const (
	// modulePath maps an import path of this module to a directory, so that
	// a constant defined as another package's constant can be resolved.
	modulePath = "github.com/evercert/evercert"
	// updateCommand is what a failure tells the reader to run.
	updateCommand = "go test ./docs/ -run TestReferenceTables -update"
)

// TestReferenceTables regenerates every generated block of
// docs/reference.md and fails, naming the block and the command that
// rewrites it, when the file differs from the code.
func TestReferenceTables(t *testing.T) {
	blocks := map[string]string{
		"flags":           flagsTable(t),
		"metrics":         metricsTable(t),
		"events":          constTable(t, "../dynamiccert", `^Reason[A-Z]`, "reason", true),
		"cabundle-events": constTable(t, "../cabundle", `^reason[A-Z]`, "reason", false),
		"podcert-reasons": constTable(t, "../podcert", `^Reason[A-Z]`, "reason", true),
		"annotations":     constTable(t, "../authority", `^[A-Z]\w*Annotation$`, "annotation", true),
		"secret-keys":     constTable(t, "../authority", `^[A-Z]\w*Key$`, "key", true),
	}
	const file = "reference.md"
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(old)
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range blocks {
			if !yield(k) {
				return
			}
		}
	}) {
		begin, end := "<!-- generated: "+name+" -->\n", "<!-- end -->"
		before, rest, ok := strings.Cut(doc, begin)
		if !ok {
			t.Errorf("docs/%s has no %q marker for the generated %s table", file, strings.TrimSpace(begin), name)
			continue
		}
		current, after, ok := strings.Cut(rest, end)
		if !ok {
			t.Errorf("docs/%s: the generated %s block has no %q after it", file, name, end)
			continue
		}
		if current == blocks[name] {
			continue
		}
		if !*update {
			t.Errorf("docs/%s: the generated %s table differs from the code; run\n\t%s\n%s", file, name, updateCommand, firstDifference(current, blocks[name], "code"))
			continue
		}
		doc = before + begin + blocks[name] + end + after
	}
	if *update && doc != string(old) {
		if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the generated tables of docs/%s", file)
	}
}

// firstDifference shows the first line where the document (have) and
// what it is generated from (want: the code, the record) part, so a
// failure says what drifted without a diff tool.
func firstDifference(have, want, from string) string {
	h, w := strings.Split(have, "\n"), strings.Split(want, "\n")
	for i := range max(len(h), len(w)) {
		var hl, wl string
		if i < len(h) {
			hl = h[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if hl != wl {
			return fmt.Sprintf("first difference, line %d of the block:\n\tdoc:    %s\n\t%-7s %s", i+1, hl, from+":", wl)
		}
	}
	return ""
}

// cell makes text safe inside a Markdown table cell.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// codeCell is a cell holding code, or nothing when s is empty.
func codeCell(s string) string {
	if s == "" {
		return ""
	}
	return "`" + cell(s) + "`"
}

// flagsTable lists the flags server.Options registers, in the order
// AddFlags registers them, with the defaults of server.NewOptions.
func flagsTable(t *testing.T) string {
	fs := pflag.NewFlagSet("evercert", pflag.ContinueOnError)
	fs.SortFlags = false
	server.NewOptions().AddFlags(fs)
	var b strings.Builder
	b.WriteString("| flag | type | default | help |\n|---|---|---|---|\n")
	n := 0
	fs.VisitAll(func(f *pflag.Flag) {
		def := f.DefValue
		if def == "[]" {
			def = ""
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s | %s |\n", f.Name, f.Value.Type(), codeCell(def), cell(f.Usage))
		n++
	})
	if n == 0 {
		t.Fatal("server.Options.AddFlags registered no flag")
	}
	return b.String()
}

// metricDesc is what a prometheus.Desc says about one metric.
type metricDesc struct {
	name, help string
	labels     []string
}

// describeMetrics reads the descriptors of every metric evercert
// registers, through the same collector a Prometheus registry is given.
// prometheus.Desc has no accessors, so its String form is parsed; a form
// this does not understand fails the test rather than dropping a metric.
func describeMetrics(t *testing.T) []metricDesc {
	ch := make(chan *prometheus.Desc)
	go func() {
		metrics.Collector().Describe(ch)
		close(ch)
	}()
	var out []metricDesc
	for d := range ch {
		s := d.String()
		m, err := parseDesc(s)
		if err != nil {
			t.Fatalf("cannot read metric descriptor %s: %v", s, err)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		t.Fatal("metrics.Collector described no metric")
	}
	return out
}

// parseDesc parses prometheus.Desc.String():
// Desc{fqName: "x", help: "y", unit: "", constLabels: {}, variableLabels: {a,b}}.
func parseDesc(s string) (metricDesc, error) {
	var m metricDesc
	rest, ok := strings.CutPrefix(s, "Desc{fqName: ")
	if !ok {
		return m, fmt.Errorf("no fqName")
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return m, fmt.Errorf("fqName: %w", err)
	}
	m.name, _ = strconv.Unquote(q)
	if rest, ok = strings.CutPrefix(rest[len(q):], ", help: "); !ok {
		return m, fmt.Errorf("no help")
	}
	if q, err = strconv.QuotedPrefix(rest); err != nil {
		return m, fmt.Errorf("help: %w", err)
	}
	m.help, _ = strconv.Unquote(q)
	_, labels, ok := strings.Cut(rest[len(q):], "variableLabels: {")
	if !ok {
		return m, fmt.Errorf("no variableLabels")
	}
	if labels, ok = strings.CutSuffix(labels, "}}"); !ok {
		return m, fmt.Errorf("variableLabels not closed")
	}
	for l := range strings.SplitSeq(labels, ",") {
		if l != "" {
			m.labels = append(m.labels, l)
		}
	}
	return m, nil
}

// metricsTable lists every evercert metric: name, labels and help.
func metricsTable(t *testing.T) string {
	var b strings.Builder
	b.WriteString("| metric | labels | help |\n|---|---|---|\n")
	for _, m := range describeMetrics(t) {
		labels := make([]string, len(m.labels))
		for i, l := range m.labels {
			labels[i] = "`" + l + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", m.name, strings.Join(labels, ", "), cell(m.help))
	}
	return b.String()
}

// constant is one string constant read from a package's source. group is
// the first sentence of the doc of the const ( ... ) group it is declared
// in, which says what the group is for ("Labels and annotations of the
// Lease ..."); empty for a constant declared on its own.
type constant struct {
	name, value, doc, group string
}

// constTable lists the string constants of the package in dir whose name
// matches pattern, as tables headed by what: one per const group, in source
// order and introduced by the group's first doc sentence, then one of the
// constants declared on their own. withDoc adds each constant's doc
// comment (a constant without one shares the doc of the one before it in
// its group, as in "A and B hold ...").
func constTable(t *testing.T, dir, pattern, what string, withDoc bool) string {
	consts := readConsts(t, dir, regexp.MustCompile(pattern))
	if len(consts) == 0 {
		t.Fatalf("no constant of %s matches %s", dir, pattern)
	}
	slices.SortStableFunc(consts, func(a, b constant) int {
		return compareBool(a.group == "", b.group == "")
	})
	var b strings.Builder
	for i, c := range consts {
		if i == 0 || c.group != consts[i-1].group {
			if i > 0 {
				b.WriteString("\n")
			}
			if c.group != "" {
				b.WriteString(c.group + "\n\n")
			}
			if withDoc {
				fmt.Fprintf(&b, "| %s | constant | meaning |\n|---|---|---|\n", what)
			} else {
				fmt.Fprintf(&b, "| %s |\n|---|\n", what)
			}
		}
		if withDoc {
			fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", c.value, c.name, cell(c.doc))
		} else {
			fmt.Fprintf(&b, "| `%s` |\n", c.value)
		}
	}
	return b.String()
}

// readConsts parses the non-test Go files of dir and returns its constants
// whose names match re, in file and source order, with their values
// resolved (a constant defined as another constant of this module is
// followed there).
func readConsts(t *testing.T, dir string, re *regexp.Regexp) []constant {
	files, values := parsePackage(t, dir)
	var out []constant
	for _, f := range files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			doc, group := "", ""
			if len(gd.Specs) > 1 && gd.Doc != nil {
				group = firstSentence(gd.Doc.Text())
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if vs.Doc != nil {
					doc = vs.Doc.Text()
				} else if len(gd.Specs) == 1 && gd.Doc != nil {
					doc = gd.Doc.Text()
				}
				for _, n := range vs.Names {
					if !re.MatchString(n.Name) {
						continue
					}
					v, err := resolve(t, dir, values, n.Name, 0)
					if err != nil {
						t.Fatalf("%s.%s: %v", dir, n.Name, err)
					}
					out = append(out, constant{name: n.Name, value: v, doc: doc, group: group})
				}
			}
		}
	}
	return out
}

// compareBool orders false before true.
func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// firstSentence is the first sentence of a doc comment, on one line.
func firstSentence(doc string) string {
	doc = strings.Join(strings.Fields(doc), " ")
	if i := strings.Index(doc, ". "); i >= 0 {
		doc = doc[:i+1]
	}
	return doc
}

// constExpr is a constant's defining expression and the file it is in,
// whose imports name the packages the expression refers to.
type constExpr struct {
	expr ast.Expr
	file *ast.File
}

// parsePackage parses the non-test Go files of dir, sorted by name, and
// indexes its constants by name.
func parsePackage(t *testing.T, dir string) ([]*ast.File, map[string]constExpr) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	values := map[string]constExpr{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		for _, decl := range f.Decls {
			if gd, ok := decl.(*ast.GenDecl); ok && gd.Tok == token.CONST {
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							values[n.Name] = constExpr{vs.Values[i], f}
						}
					}
				}
			}
		}
	}
	return files, values
}

// resolve returns the string value of the constant name of the package in
// dir: a string literal, another constant of the package, or a constant of
// another package of this module.
func resolve(t *testing.T, dir string, values map[string]constExpr, name string, depth int) (string, error) {
	if depth > 5 {
		return "", fmt.Errorf("constants refer to each other too deeply")
	}
	ce, ok := values[name]
	if !ok {
		return "", fmt.Errorf("no constant %s in %s", name, dir)
	}
	switch e := ce.expr.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", fmt.Errorf("%s is not a string constant", name)
		}
		return strconv.Unquote(e.Value)
	case *ast.Ident:
		return resolve(t, dir, values, e.Name, depth+1)
	case *ast.SelectorExpr:
		pkg, ok := e.X.(*ast.Ident)
		if !ok {
			return "", fmt.Errorf("%s: unsupported expression", name)
		}
		for _, imp := range ce.file.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			local := path.Base(p)
			if imp.Name != nil {
				local = imp.Name.Name
			}
			rel, inModule := strings.CutPrefix(p, modulePath+"/")
			if local != pkg.Name || !inModule {
				continue
			}
			other := filepath.Join("..", filepath.FromSlash(rel))
			_, otherValues := parsePackage(t, other)
			return resolve(t, other, otherValues, e.Sel.Name, depth+1)
		}
		return "", fmt.Errorf("%s refers to %s.%s outside this module", name, pkg.Name, e.Sel.Name)
	}
	return "", fmt.Errorf("%s: unsupported expression %T", name, ce.expr)
}
