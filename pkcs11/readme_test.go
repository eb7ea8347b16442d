package pkcs11_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEHSMRecipeIsCompiled keeps docs/embedding.md's "CA keys in an HSM"
// recipe identical to ExampleKeySource, which the compiler checks.
func TestREADMEHSMRecipeIsCompiled(t *testing.T) {
	readme, err := os.ReadFile("../docs/embedding.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "### CA keys in an HSM\n")
	if !ok {
		t.Fatal(`docs/embedding.md has no "### CA keys in an HSM" section`)
	}
	_, block, ok := strings.Cut(section, "```go\n")
	if ok {
		block, _, ok = strings.Cut(block, "```\n")
	}
	if !ok {
		t.Fatal("the HSM section of docs/embedding.md has no go block")
	}
	// The example's body, one tab deeper.
	for line := range strings.Lines(block) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if !strings.Contains(string(example), "\t"+line) {
			t.Errorf("docs/embedding.md line %q is not in ExampleKeySource", strings.TrimRight(line, "\n"))
		}
	}
}
