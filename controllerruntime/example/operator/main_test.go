package main

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// wiringLines counts the lines of Go between the markers "// <tag>:begin"
// and "// <tag>:end" in file (every such region), leaving out blank lines
// and comment-only lines.
func wiringLines(t *testing.T, file, tag string) int {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, regions, in := 0, 0, false
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		switch text {
		case "// " + tag + ":begin":
			if in {
				t.Fatalf("%s:%d: %s:begin inside a region", file, line, tag)
			}
			in = true
			regions++
			continue
		case "// " + tag + ":end":
			if !in {
				t.Fatalf("%s:%d: %s:end without begin", file, line, tag)
			}
			in = false
			continue
		}
		if in && text != "" && !strings.HasPrefix(text, "//") {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if in || regions == 0 {
		t.Fatalf("%s: want closed %s:begin/%s:end regions, found %d (open at the end: %v)", file, tag, tag, regions, in)
	}
	return n
}

// TestREADMELinesOfCode checks that docs/embedding.md's table "Lines of code:
// evercert vs cert-controller" states exactly the lines of certificate
// wiring in this operator (between the evercert markers in main.go) and in
// the same operator wired with cert-controller
// (../certcontroller/main.go, between its markers), so the table cannot go
// stale.
func TestREADMELinesOfCode(t *testing.T) {
	want := map[string]int{
		"evercert":        wiringLines(t, "main.go", "evercert"),
		"cert-controller": wiringLines(t, filepath.Join("..", "certcontroller", "main.go"), "cert-controller"),
	}
	t.Logf("lines of certificate wiring: evercert %d, cert-controller %d", want["evercert"], want["cert-controller"])

	readme, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "embedding.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n### Lines of code: evercert vs cert-controller\n")
	if !ok {
		t.Fatal(`docs/embedding.md has no section "### Lines of code: evercert vs cert-controller"`)
	}
	if end := strings.Index(section, "\n#"); end >= 0 {
		section = section[:end]
	}
	// A table row: | <tool> ... | <lines> |
	row := regexp.MustCompile(`(?m)^\| (evercert|cert-controller)\b[^\n]*\| (\d+) \|$`)
	got := map[string]int{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		if _, dup := got[m[1]]; dup {
			t.Errorf("docs/embedding.md: two rows for %s", m[1])
		}
		got[m[1]], _ = strconv.Atoi(m[2])
	}
	for tool, n := range want {
		g, ok := got[tool]
		switch {
		case !ok:
			t.Errorf("docs/embedding.md: no row for %s in the lines-of-code table (want %d lines)", tool, n)
		case g != n:
			t.Errorf("docs/embedding.md: %s has %d lines in the table, the code has %d", tool, g, n)
		}
	}
}
