// Command figures records the outputs of a make docs-figures run in
// docs/figures and rewrites the marked blocks of docs/measured.md from
// them (internal/docfigures renders them; go test ./docs/ checks that the
// document still matches the record). Run by make docs-figures after
// hack/bench.sh and the soak; with no flags it only re-renders the record.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/evercert/evercert/internal/docfigures"
)

func main() {
	bench := flag.String("bench", "", "hack/bench.sh's output directory (tmp/bench): record its run.txt and all.txt")
	soakLog := flag.String("soak-log", "", "a soak log (tmp/soak.log): record its report lines")
	soakCommand := flag.String("soak-command", "", "the command that wrote -soak-log, recorded with it")
	docs := flag.String("docs", "docs", "the docs directory: figures/ holds the record, measured.md the blocks")
	flag.Parse()
	if err := run(*bench, *soakLog, *soakCommand, *docs); err != nil {
		fmt.Fprintln(os.Stderr, "figures:", err)
		os.Exit(1)
	}
}

func run(bench, soakLog, soakCommand, docs string) error {
	dir := filepath.Join(docs, "figures")
	if bench != "" {
		for from, to := range map[string]string{"run.txt": docfigures.BenchRunFile, "all.txt": docfigures.BenchFile} {
			b, err := os.ReadFile(filepath.Join(bench, from))
			if err != nil {
				return fmt.Errorf("bench output: %w", err)
			}
			if err := os.WriteFile(filepath.Join(dir, to), b, 0o644); err != nil {
				return err
			}
		}
	}
	if soakLog != "" {
		if soakCommand == "" {
			return fmt.Errorf("-soak-log needs -soak-command, the command recorded with it")
		}
		b, err := os.ReadFile(soakLog)
		if err != nil {
			return fmt.Errorf("soak log: %w", err)
		}
		var rec strings.Builder
		fmt.Fprintf(&rec, "date: %s\ncommand: %s\n\n", time.Now().UTC().Format(time.DateOnly), soakCommand)
		for l := range strings.Lines(string(b)) {
			if docfigures.SoakLine.MatchString(l) {
				rec.WriteString(strings.TrimSpace(l) + "\n")
			}
		}
		if err := os.WriteFile(filepath.Join(dir, docfigures.SoakFile), []byte(rec.String()), 0o644); err != nil {
			return err
		}
	}
	in, err := docfigures.Load(dir)
	if err != nil {
		return err
	}
	file := filepath.Join(docs, "measured.md")
	doc, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	out, err := docfigures.Splice(string(doc), docfigures.Blocks(in))
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "figures: rewrote the blocks of %s from %s\n", file, dir)
	return nil
}
