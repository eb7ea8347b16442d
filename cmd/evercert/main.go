// Command evercert is the operators' tool for an evercert Authority: it
// shows where a CA rotation stands, asks the Authority to rotate now (or to
// replace a compromised CA), and checks what a TLS endpoint serves against
// the CA bundle its clients use. It talks to the API server with client-go
// and the kubeconfig, as kubectl does.
//
//	evercert status <ca-secret> [--hosts NAME,...] [--webhook validating/NAME ...]
//	evercert rotate <ca-secret> [--wait]
//	evercert rotate <ca-secret> --compromised --reason TEXT [--ca FINGERPRINT] [--wait]
//	evercert check <host:port> (--webhook validating/NAME | --cluster-trust-bundle NAME | --ca-file PATH) [--authority <ca-secret>]
//
// Installed on PATH as kubectl-evercert, it is a kubectl plugin:
// `kubectl evercert status ...`.
//
// Common flags: --kubeconfig (default $KUBECONFIG, else ~/.kube/config),
// --context, -n/--namespace (default the context's namespace), -o/--output
// (text, the default, or json).
//
// Exit codes:
//
//	0  success: the command did what was asked and everything checked is healthy
//	1  error: the API server, the network or a file failed, or --wait timed out
//	2  usage: a bad command, flag or argument (including a fingerprint the Secret does not hold)
//	3  check failed: status found something unhealthy, or check could not verify the endpoint
//
// See docs/architecture.md for how the packages fit together.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Exit codes, documented in the package comment and README.
const (
	exitOK     = 0
	exitError  = 1
	exitUsage  = 2
	exitFailed = 3
)

// exitError carries the exit code a failure maps to.
type codedError struct {
	code int
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

// usagef is a usage error: exit 2.
func usagef(format string, args ...any) error {
	return &codedError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// failedf is a failed check: exit 3.
func failedf(format string, args ...any) error {
	return &codedError{code: exitFailed, err: fmt.Errorf(format, args...)}
}

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// programName is the name usage text calls the tool by: "kubectl
// evercert" when run as the kubectl plugin.
func programName(arg0 string) string {
	base := filepath.Base(arg0)
	if name, ok := strings.CutPrefix(base, "kubectl-"); ok {
		return "kubectl " + name
	}
	if base == "" || base == "." {
		return "evercert"
	}
	return base
}

// run is the whole command: it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	prog := programName(args[0])
	if len(args) < 2 {
		fmt.Fprint(stderr, usage(prog))
		return exitUsage
	}
	var err error
	switch cmd := args[1]; cmd {
	case "status":
		err = runStatus(prog, args[2:], stdout)
	case "rotate":
		err = runRotate(prog, args[2:], stdout, stderr)
	case "check":
		err = runCheck(prog, args[2:], stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage(prog))
		return exitOK
	default:
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", prog, cmd, usage(prog))
		return exitUsage
	}
	return exitCode(prog, err, stderr)
}

// exitCode prints err and maps it to an exit code.
func exitCode(prog string, err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, errHelp) {
		return exitOK
	}
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	var ce *codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	return exitError
}

func usage(prog string) string {
	return fmt.Sprintf(`%[1]s: operate an evercert Authority (a CA kept in a Secret)

Usage:
  %[1]s status <ca-secret> [target flags]   the signing CA, the successor, each replica, each caBundle target
  %[1]s rotate <ca-secret> [--wait]         start an observed CA rotation now
  %[1]s rotate <ca-secret> --compromised --reason TEXT [--ca FINGERPRINT] [--wait]
                                             replace a compromised CA (emergency rotation)
  %[1]s check <host:port> (--webhook KIND/NAME | --cluster-trust-bundle NAME | --ca-file PATH) [--authority <ca-secret>]
                                             verify what a TLS endpoint serves; say which CA and replica

Run '%[1]s <command> --help' for a command's flags.
Exit codes: 0 ok, 1 error (API, network, file, --wait timed out), 2 usage, 3 check failed / not healthy.
`, prog)
}
