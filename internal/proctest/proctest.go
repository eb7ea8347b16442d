// Package proctest builds the project's commands and runs them as
// subprocesses in tests, stopping them by pid when the test ends.
package proctest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildMu sync.Mutex
	// buildDir holds every binary Build made; Main creates and removes it.
	buildDir string
	built    = map[string]string{}
)

// Main runs the tests of a package whose tests build commands with Build,
// and removes the binaries when they are done: call it from TestMain as
// os.Exit(proctest.Main(m)). Build fails a test that runs without it, so
// that no test process leaves its binaries (about 90 MB each) behind in the
// temporary directory.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "evercert-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "proctest:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	buildMu.Lock()
	buildDir = dir
	buildMu.Unlock()
	return m.Run()
}

// Dir returns the directory Build writes binaries to, for a test that
// places its own executables next to them; Main removes it.
func Dir(t testing.TB) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir == "" {
		t.Fatal("proctest: TestMain must call proctest.Main")
	}
	return buildDir
}

// Build compiles the main package pkg (an import path such as
// "github.com/evercert/evercert/example/server") once per test process and
// returns the binary's path. The package's TestMain must call Main.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	dir := Dir(t)
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := built[pkg]; ok {
		return bin
	}
	// A directory per package: binaries of different packages may share a
	// base name, which is also the name the process runs under.
	bin := filepath.Join(dir, strconv.Itoa(len(built)), filepath.Base(pkg))
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatalf("building %s: %v", pkg, err)
	}
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, err, out)
	}
	built[pkg] = bin
	return bin
}

// Process is a running subprocess whose output is captured.
type Process struct {
	cmd    *exec.Cmd
	exited chan error
	// killed is set by Kill: the exit status of a SIGKILLed process is no
	// failure of the test that killed it.
	killed bool
	mu     sync.Mutex
	out    strings.Builder
}

// Pid returns the process id, for reading what the process used from
// /proc (its CPU time, say).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Output returns everything the process wrote to stdout and stderr so far.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Start runs bin with args, waits until a line of its output matches ready
// (whose first submatch is returned), and stops it with SIGTERM when the
// test ends, failing the test if it does not exit cleanly within 20 s. On
// failure the process output is logged.
func Start(t testing.TB, bin string, ready *regexp.Regexp, args ...string) (*Process, string) {
	t.Helper()
	return StartCmd(t, exec.Command(bin, args...), ready)
}

// StartCmd is Start for a command the caller prepared (its environment,
// say: cmd.Env); Start sets its output and SysProcAttr, so the caller
// must not.
func StartCmd(t testing.TB, cmd *exec.Cmd, ready *regexp.Regexp) (*Process, string) {
	t.Helper()
	bin := cmd.Path
	p := &Process{cmd: cmd, exited: make(chan error, 1)}
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	match := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if m := ready.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case match <- m[len(m)-1]:
				default:
				}
			}
		}
	}()
	go func() {
		err := p.cmd.Wait()
		pw.Close()
		p.exited <- err
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.exited:
			p.mu.Lock()
			killed := p.killed
			p.mu.Unlock()
			if err != nil && !killed {
				t.Errorf("%s did not exit cleanly on SIGTERM: %v", filepath.Base(bin), err)
			}
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			t.Errorf("%s did not exit within 20s of SIGTERM", filepath.Base(bin))
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), p.Output())
		}
	})
	select {
	case m := <-match:
		return p, m
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("%s exited before it was ready: %v\n%s", filepath.Base(bin), err, p.Output())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s not ready within 60s\n%s", filepath.Base(bin), p.Output())
	}
	return p, ""
}

// Terminate sends SIGTERM and waits, for at most ExitGuard (a hang guard,
// not a timed assertion), for the process to exit. It returns the exit
// code; the test fails if the process is still running then. The cleanup
// of Start then finds the process exited, and fails the test if the code
// was not 0.
func (p *Process) Terminate(t testing.TB) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM to pid %d: %v", p.Pid(), err)
	}
	select {
	case err := <-p.exited:
		p.exited <- err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("waiting for pid %d: %v", p.Pid(), err)
		}
		return 0
	case <-time.After(ExitGuard):
		t.Fatalf("pid %d still running %v after SIGTERM", p.Pid(), ExitGuard)
		return -1
	}
}

// Kill sends SIGKILL, as a crash or an OOM kill ends a process (no
// shutdown runs), and waits for the process to be gone, for at most
// ExitGuard (a hang guard). The cleanup of Start then accepts its exit
// status.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	// A process that already exited (a crash of its own, a second Kill)
	// is as gone as a killed one.
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("SIGKILL to pid %d: %v", p.Pid(), err)
	}
	select {
	case err := <-p.exited:
		p.exited <- err
	case <-time.After(ExitGuard):
		t.Fatalf("pid %d still running %v after SIGKILL", p.Pid(), ExitGuard)
	}
}

// ExitGuard is how long RunToExit lets a process run that should exit by
// itself (a start-up error, --help): generous, it only guards against a
// hang.
const ExitGuard = time.Minute

// RunToExit starts cmd (prepared by the caller: args, Env, Dir), waits for
// it to exit, and returns its exit code and combined output. A process still
// running after ExitGuard is killed and the test fails. The process dies
// with the test process (Pdeathsig).
func RunToExit(t testing.TB, cmd *exec.Cmd) (int, string) {
	t.Helper()
	return RunToExitWithin(t, cmd, ExitGuard)
}

// RunToExitWithin is RunToExit with another hang guard, for a process that
// is expected to run for a while (a command given --timeout): the guard
// must exceed the process's own limit, or a slow machine fails the test by
// killing a process that would have answered in time.
func RunToExitWithin(t testing.TB, cmd *exec.Cmd, guard time.Duration) (int, string) {
	t.Helper()
	var out LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", filepath.Base(cmd.Path), err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), out.String()
		}
		if err != nil {
			t.Fatalf("waiting for %s: %v", filepath.Base(cmd.Path), err)
		}
		return 0, out.String()
	case <-time.After(guard):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("%s %v still running %v after start (killed); output:\n%s", filepath.Base(cmd.Path), cmd.Args[1:], guard, out.String())
		return 0, ""
	}
}

// LockedBuffer is an output buffer that a process (or a server run in the
// test process) writes while the test reads it. The zero value is ready to
// use; it is safe for concurrent use.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
