package dynamiccert_test

import (
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// moduleRoot is the module's root directory, seen from this package's.
const moduleRoot = ".."

// architectureDoc is the document every package doc points to.
const architectureDoc = "docs/architecture.md"

// pkgDoc is what the package clause of one package's files says.
type pkgDoc struct {
	dir  string // relative to the module root, slash separated
	name string
	doc  string // the package doc comments of its files, joined
	// helper: a test helper package (it imports "testing", or its name
	// ends in "test" like net/http/httptest); it needs no pointer.
	helper bool
}

// modulePackages reads the package clause and imports of every package in
// the module except those under hack/, test/ and deploy/ (build tooling,
// test programs and manifests, not packages anyone imports). It parses no
// declarations, so it stays cheap.
func modulePackages(t *testing.T) []pkgDoc {
	t.Helper()
	byDir := map[string]*pkgDoc{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(moduleRoot, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch {
			case rel == ".":
				return nil
			case strings.HasPrefix(d.Name(), "."), d.Name() == "testdata", d.Name() == "bin",
				rel == "hack", rel == "test", rel == "deploy", rel == "docs":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		p := byDir[dir]
		if p == nil {
			p = &pkgDoc{dir: dir, name: f.Name.Name}
			byDir[dir] = p
		}
		if f.Doc != nil {
			p.doc += f.Doc.Text()
		}
		p.helper = p.helper || strings.HasSuffix(p.name, "test") || slices.ContainsFunc(f.Imports, func(s *ast.ImportSpec) bool {
			return s.Path.Value == `"testing"`
		})
		return nil
	})
	require.NoError(t, err)
	var out []pkgDoc
	for _, p := range byDir {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b pkgDoc) int { return strings.Compare(a.dir, b.dir) })
	require.NotEmpty(t, out)
	return out
}

// TestPackageDocHasObservedRotation checks that the observed-rotation
// text, which the README and other package docs point to, is part of the
// package documentation (go doc shows it) and is a heading there, and not a
// comment that merely sits in doc.go after the package clause.
func TestPackageDocHasObservedRotation(t *testing.T) {
	var doc string
	for _, p := range modulePackages(t) {
		if p.dir == "authority" {
			doc = p.doc
		}
	}
	require.NotEmpty(t, doc, "authority has no package doc comment")
	var headings []string
	for _, b := range new(comment.Parser).Parse(doc).Content {
		if h, ok := b.(*comment.Heading); ok {
			var text strings.Builder
			for _, x := range h.Text {
				if p, ok := x.(comment.Plain); ok {
					text.WriteString(string(p))
				}
			}
			headings = append(headings, text.String())
		}
	}
	assert.Contains(t, headings, "Observed rotation", "headings of the authority package doc")
	var missing []string
	for _, s := range []string{"PropagationDelay", "Lease", "unsafe rotation", "Clock skew"} {
		if !strings.Contains(doc, s) {
			missing = append(missing, s)
		}
	}
	assert.Empty(t, missing, "the authority package doc must describe observed rotation")
}

// TestArchitectureDocIsCurrent checks that docs/architecture.md exists,
// that every package's doc comment points to it, and that it names every
// package and every metric, so that a new package or metric cannot be added
// without it.
func TestArchitectureDocIsCurrent(t *testing.T) {
	arch, err := os.ReadFile(filepath.Join(moduleRoot, filepath.FromSlash(architectureDoc)))
	require.NoError(t, err, "the architecture document is missing")
	text := string(arch)

	var noPointer, unnamed []string
	for _, p := range modulePackages(t) {
		if p.helper {
			continue
		}
		if !strings.Contains(p.doc, architectureDoc) {
			noPointer = append(noPointer, p.dir)
		}
		if !strings.Contains(text, "`"+p.dir+"`") {
			unnamed = append(unnamed, p.dir)
		}
	}
	assert.Empty(t, noPointer, "these packages' doc comments do not point to %s", architectureDoc)
	assert.Empty(t, unnamed, "%s does not name these packages (as `dir`): add them to its package list", architectureDoc)

	// Every metric is defined in internal/certmetrics (namespace evercert).
	names := map[string]bool{}
	files, err := filepath.Glob(filepath.Join(moduleRoot, "internal", "certmetrics", "*.go"))
	require.NoError(t, err)
	nameRE := regexp.MustCompile(`(?m)^\s*Name:\s*"([a-z0-9_]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range nameRE.FindAllStringSubmatch(string(src), -1) {
			names["evercert_"+m[1]] = true
		}
	}
	require.NotEmpty(t, names, "no metric definitions found in internal/certmetrics")
	var unlisted []string
	for name := range names {
		if !strings.Contains(text, name) {
			unlisted = append(unlisted, name)
		}
	}
	slices.Sort(unlisted)
	assert.Empty(t, unlisted, "%s does not list these metrics: add them to its Metrics section", architectureDoc)
}
