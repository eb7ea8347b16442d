package deploy

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// TestGoInstallAndKubectlPlugin: what a user on a clean machine types
// works. The checkout's HEAD commit (what is committed, not the work tree)
// is served as a module version from a GOPROXY directory, built the way
// the module proxy builds it (golang.org/x/mod/zip from git, a pseudo
// version), and then:
//
//   - go install github.com/evercert/evercert/cmd/evercert@<version> run
//     outside any module, into an empty GOBIN, as the README says. This
//     fails if the main module's go.mod gained a replace directive (go
//     install pkg@version refuses those), if a file the command needs is
//     not committed, or if go.sum lacks a hash;
//   - the binary's build information names that module version;
//   - linked as kubectl-evercert into a directory on PATH (the docs' ln -s),
//     it is found by a PATH lookup, which is what kubectl does for a plugin
//     (kubectl evercert ... runs kubectl-evercert ...), and its usage calls
//     it "kubectl evercert". kubectl itself is not installed here, so the
//     lookup is the shell's, not kubectl's.
//
// The dependencies come from the module cache and the configured GOPROXY as
// for any user; only the evercert module comes from the directory.
func TestGoInstallAndKubectlPlugin(t *testing.T) {
	root := repoRoot(t)
	const modPath = "github.com/evercert/evercert"
	commit := gitOutput(t, root, "rev-parse", "HEAD")
	sec, err := strconv.ParseInt(gitOutput(t, root, "log", "-1", "--format=%ct", "HEAD"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	when := time.Unix(sec, 0).UTC()
	version := module.PseudoVersion("", "", when, commit[:12])

	// The GOPROXY protocol's files for one version of one module.
	proxy := t.TempDir()
	esc, err := module.EscapePath(modPath)
	if err != nil {
		t.Fatal(err)
	}
	vdir := filepath.Join(proxy, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A clone, since a worktree's .git is a file that x/mod/zip does not
	// take for a repository.
	clone := filepath.Join(t.TempDir(), "evercert")
	commandOutput(t, root, "git", "clone", "--quiet", "--no-checkout", root, clone)
	var z bytes.Buffer
	if err := zip.CreateFromVCS(&z, module.Version{Path: modPath, Version: version}, clone, commit, ""); err != nil {
		t.Fatalf("module zip of %s: %v", commit, err)
	}
	gomod := commandOutput(t, root, "git", "show", commit+":go.mod")
	info, err := json.Marshal(map[string]any{"Version": version, "Time": when.Format(time.RFC3339)})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  []byte(gomod + "\n"),
		version + ".zip":  z.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	gobin := t.TempDir()
	install := exec.Command("go", "install", modPath+"/cmd/evercert@"+version)
	install.Dir = t.TempDir() // outside any module, as on a clean machine
	install.Env = append(os.Environ(),
		"GOBIN="+gobin,
		"GOPROXY=file://"+proxy+","+goOutput(t, root, "env", "GOPROXY"),
		// The checksum database does not know this version; every other
		// module is checked as usual.
		"GONOSUMDB="+modPath,
		"GOFLAGS=",
	)
	start := time.Now()
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install %s/cmd/evercert@%s: %v\n%s", modPath, version, err, out)
	}
	t.Logf("go install %s/cmd/evercert@%s: %v", modPath, version, time.Since(start).Round(time.Millisecond))

	bin := filepath.Join(gobin, "evercert")
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if bi.Main.Path != modPath || bi.Main.Version != version {
		t.Errorf("installed binary is of %s@%s, want %s@%s", bi.Main.Path, bi.Main.Version, modPath, version)
	}

	plugins := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(plugins, "kubectl-evercert")); err != nil {
		t.Fatal(err)
	}
	for _, args := range []string{"--help", "status --help"} {
		sh := exec.Command("sh", "-c", "kubectl-evercert "+args)
		sh.Env = append(os.Environ(), "PATH="+plugins+string(os.PathListSeparator)+"/usr/bin:/bin")
		var stdout, stderr bytes.Buffer
		sh.Stdout, sh.Stderr = &stdout, &stderr
		if err := sh.Run(); err != nil {
			t.Fatalf("kubectl-evercert %s: %v\n%s%s", args, err, stdout.String(), stderr.String())
		}
		out := stdout.String() + stderr.String()
		if !strings.Contains(out, "kubectl evercert status") {
			t.Errorf("kubectl-evercert %s: usage does not call it kubectl evercert:\n%s", args, out)
		}
	}
}
