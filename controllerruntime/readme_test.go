package controllerruntime

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeSection is the heading of the docs/embedding.md section this
// package backs (the README shows an excerpt of it, which the docs package
// checks against that page).
const readmeSection = "## controller-runtime: one call"

// TestREADMERecipesAreCompiled checks that every Go block of docs/embedding.md's
// "controller-runtime: one call" section appears verbatim in
// example_test.go, which the compiler checks.
func TestREADMERecipesAreCompiled(t *testing.T) {
	readme, err := os.ReadFile("../docs/embedding.md")
	require.NoError(t, err)
	example, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	_, section, found := strings.Cut(string(readme), "\n"+readmeSection+"\n")
	require.True(t, found, "docs/embedding.md has no section %q", readmeSection)
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	blocks := 0
	for rest := section; ; {
		_, after, ok := strings.Cut(rest, "```go\n")
		if !ok {
			break
		}
		block, tail, ok := strings.Cut(after, "```\n")
		require.True(t, ok, "unterminated Go block in the docs/embedding.md section")
		require.Contains(t, string(example), block, "docs/embedding.md Go block %d is not in example_test.go verbatim", blocks+1)
		blocks++
		rest = tail
	}
	require.GreaterOrEqual(t, blocks, 3, "the docs/embedding.md section lost its Go blocks")
}
