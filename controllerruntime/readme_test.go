package controllerruntime

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeSection is the heading of the README section this package backs.
const readmeSection = "## controller-runtime: one call"

// TestREADMERecipesAreCompiled checks that every Go block of the README's
// "controller-runtime: one call" section appears verbatim in
// example_test.go, which the compiler checks.
func TestREADMERecipesAreCompiled(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	example, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	_, section, found := strings.Cut(string(readme), "\n"+readmeSection+"\n")
	require.True(t, found, "README has no section %q", readmeSection)
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
		require.True(t, ok, "unterminated Go block in the README section")
		require.Contains(t, string(example), block, "README Go block %d is not in example_test.go verbatim", blocks+1)
		blocks++
		rest = tail
	}
	require.GreaterOrEqual(t, blocks, 3, "the README section lost its Go blocks")
}
