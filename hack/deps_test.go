// Package hack holds no library code: its tests check that every program the
// tests and the Makefile run reaches a fresh machine through the project's
// own scripts, and that the nested modules build their dependencies at the
// root module's versions (modules_test.go), so a cold build cache compiles
// the packages they share once.
package hack

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A program comes to a machine in one of these ways.
const (
	// prerequisite: what docs/development.md asks for before
	// `make test`: the Go toolchain, make and git.
	prerequisite = "prerequisite"
	// essential: a Debian Essential package, present on every Debian system.
	essential = "essential"
	// installDeps: a Debian package hack/install-deps.sh installs.
	installDeps = "install-deps"
	// hackBuilt: built by a script under hack/ (install-kube.sh, verify.sh).
	hackBuilt = "hack"
	// repoBuilt: built from this repository by the test itself (go build,
	// the test binary re-running itself).
	repoBuilt = "repo"
)

// origin says where each program the tests run comes from and, for Debian
// packages, which package provides it. A program found in the tests or the
// Makefile that is missing here fails the test: classify it, and if it is a
// package, add it to hack/install-deps.sh.
var origin = map[string]struct{ how, pkg string }{
	"go":             {prerequisite, ""},
	"gofmt":          {prerequisite, ""},
	"make":           {prerequisite, ""},
	"git":            {prerequisite, ""},
	"bash":           {essential, "bash"},
	"sh":             {essential, "dash"},
	"cat":            {essential, "coreutils"},
	"mkdir":          {essential, "coreutils"},
	"rm":             {essential, "coreutils"},
	"tail":           {essential, "coreutils"},
	"grep":           {essential, "grep"},
	"sslscan":        {installDeps, "sslscan"},
	"openssl":        {installDeps, "openssl"},
	"promtool":       {installDeps, "prometheus"},
	"pgrep":          {installDeps, "procps"},
	"softhsm2-util":  {installDeps, "softhsm2"},
	"kube-apiserver": {hackBuilt, "hack/install-kube.sh"},
	"etcd":           {hackBuilt, "hack/install-kube.sh"},
	"staticcheck":    {hackBuilt, "hack/verify.sh"},
}

// indirect classifies the exec calls whose program is not a string literal,
// keyed by file and the expression that names the program. A new such call
// fails the test until it is added here; an entry no call uses any more
// fails it too, so the table stays true.
var indirect = map[string][]string{
	"cmd/evercert/main_test.go bin":               {repoBuilt},
	"cmd/evercert/restart_test.go bin":            {repoBuilt},
	"controllerruntime/e2e/replica_test.go r.bin": {repoBuilt},
	"example/server/server_test.go proctest.Build(t, \"github.com/evercert/evercert/example/server\")": {repoBuilt},
	"example/server/second_signal_test.go bin":                                                         {repoBuilt},
	"example/server/startup_test.go bin":                                                               {repoBuilt},
	"example/signer/main_test.go bin":                                                                  {repoBuilt},
	"example/webhook/main_test.go bin":                                                                 {repoBuilt},
	"internal/proctest/proctest.go bin":                                                                {repoBuilt},
	"internal/testcluster/process.go bin":                                                              {"kube-apiserver", "etcd"},
	"internal/testcluster/testcluster.go bin":                                                          {"kube-apiserver", "etcd"},
	"internal/tlstest/tlstest.go bin":                                                                  {"openssl"},
	"loopback/recommended_test.go os.Args[0]":                                                          {repoBuilt},
	"test/fips/helpers_test.go bin":                                                                    {repoBuilt},
	"test/fips/helpers_test.go requireFIPSServer(t)":                                                   {repoBuilt},
	"test/fips/validate_test.go os.Args[0]":                                                            {repoBuilt},
	"test/fips/wire_test.go bin":                                                                       {"sslscan"},
	"test/posture/posture_test.go bin":                                                                 {repoBuilt, "sslscan"},
	"test/posture/posture_test.go goTool()":                                                            {"go"},
	"test/deploy/helm_test.go u.bin()":                                                                 {repoBuilt},
	"test/deploy/attest_test.go name":                                                                  {"go", "git"},
	"test/deploy/manifests_test.go u.bin()":                                                            {repoBuilt},
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

// TestEveryProgramReachesAFreshMachine lists the external programs the Go
// tests and the Makefile run and fails unless each one is a prerequisite,
// in Debian's Essential set, built by hack/, or installed by
// hack/install-deps.sh on a machine that has none of its packages.
func TestEveryProgramReachesAFreshMachine(t *testing.T) {
	root := repoRoot(t)
	programs := map[string][]string{} // program -> where it is run
	for prog, where := range goPrograms(t, root) {
		programs[prog] = append(programs[prog], where...)
	}
	for prog, where := range makePrograms(t, root) {
		programs[prog] = append(programs[prog], where...)
	}
	// Sanity: the scan finds what we know is there; a scanner that finds
	// nothing would pass everything.
	for _, want := range []string{"sslscan", "openssl", "promtool", "kube-apiserver", "etcd", "go"} {
		if _, ok := programs[want]; !ok {
			t.Errorf("scan did not find %q; the scanner is broken", want)
		}
	}

	installed := fakeInstall(t, root)
	t.Logf("on a fresh machine hack/install-deps.sh installs: %v", installed)

	names := make([]string, 0, len(programs))
	for p := range programs {
		names = append(names, p)
	}
	slices.Sort(names)
	for _, prog := range names {
		where := programs[prog]
		o, ok := origin[prog]
		switch {
		case !ok:
			t.Errorf("%s (run by %v) has no known origin: add it to hack/install-deps.sh or build it in hack/, and to origin in hack/deps_test.go", prog, where)
		case o.how == installDeps && !slices.Contains(installed, o.pkg):
			t.Errorf("%s (run by %v) comes from the Debian package %s, which hack/install-deps.sh does not install on a fresh machine", prog, where, o.pkg)
		case o.how == hackBuilt:
			if _, err := os.Stat(filepath.Join(root, o.pkg)); err != nil {
				t.Errorf("%s (run by %v) is built by %s: %v", prog, where, o.pkg, err)
			} else if b, _ := os.ReadFile(filepath.Join(root, o.pkg)); !bytes.Contains(b, []byte(prog)) {
				t.Errorf("%s (run by %v) is said to be built by %s, which never names it", prog, where, o.pkg)
			}
		}
	}
}

// goPrograms finds every exec.Command, exec.CommandContext and exec.LookPath
// call in the repository's Go files and names the program each one runs.
func goPrograms(t *testing.T, root string) map[string][]string {
	t.Helper()
	found := map[string][]string{}
	used := map[string]bool{}
	fset := token.NewFileSet()
	err := walkSources(root, func(path, rel string) error {
		if !strings.HasSuffix(path, ".go") || rel == "hack/deps_test.go" {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "exec" {
				return true
			}
			arg := 0
			switch sel.Sel.Name {
			case "Command", "LookPath":
			case "CommandContext":
				arg = 1
			default:
				return true
			}
			if len(call.Args) <= arg {
				return true
			}
			where := rel + ":" + strconv.Itoa(fset.Position(call.Pos()).Line)
			if lit, ok := call.Args[arg].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				prog, _ := strconv.Unquote(lit.Value)
				found[prog] = append(found[prog], where)
				return true
			}
			var expr bytes.Buffer
			_ = printer.Fprint(&expr, fset, call.Args[arg])
			key := rel + " " + expr.String()
			progs, ok := indirect[key]
			if !ok {
				t.Errorf("%s runs %s: classify it in indirect in hack/deps_test.go (%q)", where, expr.String(), key)
				return true
			}
			used[key] = true
			for _, p := range progs {
				if p != repoBuilt {
					found[p] = append(found[p], where)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatalf("scanning Go files: %v", err)
	}
	for key := range indirect {
		if !used[key] {
			t.Errorf("indirect names %q, which no exec call uses any more: remove it", key)
		}
	}
	return found
}

var (
	makeVar     = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	quoted      = regexp.MustCompile(`'[^']*'|"[^"]*"`)
	separators  = regexp.MustCompile(`&&|\|\||[;|{}()!]`)
	assignment  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	shellWords  = []string{"cd", "set", "exit", "echo", "printf", "for", "in", "do", "done", "if", "then", "else", "fi", "true", "false", "test", "[", "export", "command"}
	makefiles   = []string{"Makefile", "hack/e2e.mk", ".ci/run"}
	makeProgram = map[string]string{"GO": "go", "MAKE": "make"}
)

// makePrograms names the programs the recipes of the Makefiles (and the
// lines of .ci/run) start, including those named by `command -v`.
func makePrograms(t *testing.T, root string) map[string][]string {
	t.Helper()
	found := map[string][]string{}
	for _, name := range makefiles {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "\\\n", " ")
		for i, line := range strings.Split(text, "\n") {
			if name != ".ci/run" && !strings.HasPrefix(line, "\t") {
				continue // not a recipe line
			}
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			where := name + ":" + strconv.Itoa(i+1)
			line = makeVar.ReplaceAllStringFunc(line, func(v string) string {
				if p, ok := makeProgram[makeVar.FindStringSubmatch(v)[1]]; ok {
					return p
				}
				return "VAR"
			})
			line = quoted.ReplaceAllString(line, "Q")
			for _, segment := range separators.Split(line, -1) {
				words := strings.Fields(strings.TrimLeft(strings.TrimSpace(segment), "@-"))
				for len(words) > 0 && (assignment.MatchString(words[0]) || words[0] == "do" || words[0] == "then") {
					words = words[1:]
				}
				if len(words) == 0 {
					continue
				}
				prog := words[0]
				if prog == "command" && len(words) > 2 && words[1] == "-v" {
					prog = words[2]
				} else if slices.Contains(shellWords, prog) {
					continue
				}
				if strings.Contains(prog, "/") || strings.HasPrefix(prog, "$") || prog == "VAR" || prog == "Q" {
					continue // a script of this repository, or a variable
				}
				found[prog] = append(found[prog], where)
			}
		}
	}
	return found
}

// fakeInstall runs hack/install-deps.sh on a PATH where dpkg-query reports
// every package missing and apt-get records what it is asked to install,
// then puts that package's programs on PATH as a real install would. It
// returns the packages installed. It also checks the script's two other
// paths: nothing to do when everything is installed, and a failure when a
// package does not bring its program.
func fakeInstall(t *testing.T, root string) []string {
	t.Helper()
	script := filepath.Join(root, "hack", "install-deps.sh")
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash: %v", err)
	}

	// What each package puts on PATH, from origin.
	provides := map[string][]string{}
	for prog, o := range origin {
		if o.how == installDeps {
			provides[o.pkg] = append(provides[o.pkg], prog)
		}
	}
	chmod, err := exec.LookPath("chmod")
	if err != nil {
		t.Fatalf("chmod: %v", err)
	}
	var cases strings.Builder
	for pkg, progs := range provides {
		cases.WriteString("    " + pkg + ")")
		for _, p := range progs {
			cases.WriteString(` printf '#!/bin/sh\n' > "$bin/` + p + `"; ` + chmod + ` +x "$bin/` + p + `";`)
		}
		cases.WriteString(" ;;\n")
	}

	run := func(t *testing.T, installedAlready, aptInstalls bool) (log string, out []byte, err error) {
		bin := t.TempDir()
		for _, tool := range []string{"grep", "id"} {
			p, err := exec.LookPath(tool)
			if err != nil {
				t.Fatalf("%s: %v", tool, err)
			}
			if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
				t.Fatal(err)
			}
		}
		dpkg := "#!/bin/sh\nexit 1\n"
		if installedAlready {
			dpkg = "#!/bin/sh\nprintf 'install ok installed'\n"
			for _, progs := range provides {
				for _, p := range progs {
					writeExec(t, filepath.Join(bin, p), "#!/bin/sh\n")
				}
			}
		}
		writeExec(t, filepath.Join(bin, "dpkg-query"), dpkg)
		writeExec(t, filepath.Join(bin, "sudo"), "#!/bin/sh\n[ \"$1\" = -n ] && shift\nexec \"$@\"\n")
		aptLog := filepath.Join(t.TempDir(), "apt.log")
		apt := "#!/bin/sh\nbin=" + bin + "\necho \"$@\" >> " + aptLog + "\n"
		if aptInstalls {
			apt += "[ \"$1\" = install ] || exit 0\nfor a in \"$@\"; do\n  case \"$a\" in\n" + cases.String() + "  esac\ndone\n"
		}
		writeExec(t, filepath.Join(bin, "apt-get"), apt)
		cmd := exec.Command(bash, script)
		cmd.Env = []string{"PATH=" + bin, "HOME=" + t.TempDir()}
		out, err = cmd.CombinedOutput()
		b, _ := os.ReadFile(aptLog)
		return string(b), out, err
	}

	aptLog, out, err := run(t, false, true)
	if err != nil {
		t.Fatalf("hack/install-deps.sh on a fresh machine: %v\n%s", err, out)
	}
	var installed []string
	for _, line := range strings.Split(aptLog, "\n") {
		words := strings.Fields(line)
		if len(words) == 0 || words[0] != "install" {
			continue
		}
		for _, w := range words[1:] {
			if !strings.HasPrefix(w, "-") && !slices.Contains(installed, w) {
				installed = append(installed, w)
			}
		}
	}
	slices.Sort(installed)

	t.Run("nothing to do", func(t *testing.T) {
		aptLog, out, err := run(t, true, true)
		if err != nil || aptLog != "" {
			t.Errorf("with every package installed: err=%v, apt-get called with %q\n%s", err, aptLog, out)
		}
	})
	t.Run("package without its program", func(t *testing.T) {
		_, out, err := run(t, false, false)
		if err == nil || !strings.Contains(string(out), "still not on PATH") {
			t.Errorf("an install that brings no program passed: err=%v\n%s", err, out)
		}
	})
	return installed
}

func writeExec(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

// walkSources calls fn for every file of the repository at root, with its
// path and its path relative to root, leaving out what the build makes or
// downloads (hack/tools, bin, tmp) and .git.
func walkSources(root string, fn func(path, rel string) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "hack/tools", "bin", "tmp", ".git":
				return filepath.SkipDir
			}
			return nil
		}
		return fn(path, rel)
	})
}
