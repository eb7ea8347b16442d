package testcluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// stopTimeout is how long a process gets to exit after SIGTERM before its
// process group is killed.
const stopTimeout = 10 * time.Second

// process is one running child (etcd or kube-apiserver).
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // result of cmd.Wait; valid after done is closed
}

// startProcess starts bin with args in its own process group, appending
// stdout and stderr to logPath.
//
// On Linux the child gets Pdeathsig=SIGKILL (see sysProcAttr) so that it
// dies with the test binary even if the test is killed without running its
// cleanups. Linux delivers the parent-death signal when the *thread* that
// forked the child exits, not the process, so the child is started and
// waited for from a goroutine locked to its OS thread for the whole lifetime
// of the child; the Go runtime never retires that thread while the goroutine
// holds it.
func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	fmt.Fprintf(logFile, "=== testcluster: %s starting at %s: %s %s\n",
		name, time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = childEnv()
	cmd.SysProcAttr = sysProcAttr()

	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	return p, nil
}

// childEnv returns the environment for the children: ours, minus the ETCD_*
// variables that etcd would interpret as flags.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ETCD_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitError describes how the process exited; call only after done is closed.
func (p *process) exitError() error {
	if p.err != nil {
		return fmt.Errorf("%s exited: %w", p.name, p.err)
	}
	return fmt.Errorf("%s exited with status 0", p.name)
}

// stop sends SIGTERM to the process group, waits up to stopTimeout, then
// sends SIGKILL to the group and waits for the process to be reaped. It is
// safe to call more than once.
func (p *process) stop() error {
	if p.exited() {
		return nil
	}
	pgid := p.cmd.Process.Pid // Setpgid: the child leads its own group.
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGTERM %s (pgid %d): %w", p.name, pgid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGKILL %s (pgid %d): %w", p.name, pgid, err)
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s did not exit within %s of SIGTERM and was killed", p.name, stopTimeout)
	case <-time.After(stopTimeout):
		return fmt.Errorf("%s (pid %d) did not exit even after SIGKILL", p.name, pgid)
	}
}

// tail returns the last n lines of the file at path, or a note saying why
// it could not be read.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	data = bytes.TrimRight(data, "\n")
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
