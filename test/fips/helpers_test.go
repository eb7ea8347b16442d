//go:build fips

// Package fips checks evercert in Go's FIPS 140-3 mode: it builds
// ./example/server with GOFIPS140=latest, runs it under
// GODEBUG=fips140=only on 127.0.0.1, and checks from the outside (sslscan,
// a Go client that runs normally and so can offer what FIPS mode refuses,
// and a raw ClientHello prober for signature algorithms) that only approved
// protocols, suites, groups, signature algorithms and keys are negotiated;
// that what is not approved is refused at start-up, naming the flag; and,
// in child processes of this test binary, Options.Validate in each fips140
// mode. Run it with `make test-fips` (build tag fips). It needs sslscan
// (hack/install-deps.sh).
package fips

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/buildinfo"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/proctest"
)

// Generous guards against hangs; nothing asserts on time.
const (
	buildTimeout = 10 * time.Minute // a cold GOFIPS140 build on a busy 2-core machine
	startTimeout = time.Minute
	stopTimeout  = time.Minute // SIGTERM to exit: up to --shutdown-timeout, then connections are cut
	exitTimeout  = time.Minute
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "evercert-fips-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// envWith returns the environment without GODEBUG and GOFIPS140, plus kv.
func envWith(kv ...string) []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GODEBUG=") && !strings.HasPrefix(e, "GOFIPS140=") {
			env = append(env, e)
		}
	}
	return append(env, kv...)
}

// fipsServer builds ./example/server with GOFIPS140=latest once per test
// binary. `go test` puts its own toolchain first in PATH.
var fipsServer = sync.OnceValues(func() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("go env GOMOD: not inside the evercert module")
	}
	bin := filepath.Join(binDir, "server-fips")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./example/server")
	build.Dir = filepath.Dir(gomod)
	build.Env = envWith("GOFIPS140=latest")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("GOFIPS140=latest go build ./example/server: %w\n%s", err, out)
	}
	return bin, nil
})

func requireFIPSServer(t *testing.T) string {
	t.Helper()
	bin, err := fipsServer()
	require.NoError(t, err)
	return bin
}

// buildSettings returns the build settings recorded in bin.
func buildSettings(t *testing.T, bin string) map[string]string {
	t.Helper()
	info, err := buildinfo.ReadFile(bin)
	require.NoError(t, err)
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	return settings
}

// lockedBuffer collects a subprocess's stdout and stderr.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// serverProc is a running example server.
type serverProc struct {
	cmd    *exec.Cmd
	output *lockedBuffer
	exited chan struct{}
	err    error
	// Addr is host:port from the "serving on https://HOST:PORT" line.
	Addr string
}

// shutdownTimeout is the servers' --shutdown-timeout.
const shutdownTimeout = "2s"

// shutdownWarning is the line a server logs when its shutdown cut
// connections, with their list.
var shutdownWarning = regexp.MustCompile(`Warning: connections still open after --shutdown-timeout were closed.* connections=\[(.*)\]`)

var servingOn = regexp.MustCompile(`serving on https://(127\.0\.0\.1:[0-9]+)`)

// startServer runs the FIPS build of the example server with the GODEBUG
// value godebug ("" leaves the build's default, fips140=on) and args (plus
// --bind-address=127.0.0.1 --secure-port=0), waits for "serving on", and
// stops it by pid with SIGTERM when the test ends.
func startServer(t *testing.T, godebug string, args ...string) *serverProc {
	t.Helper()
	bin := requireFIPSServer(t)
	p := &serverProc{output: &lockedBuffer{}, exited: make(chan struct{})}
	// A short --shutdown-timeout: whatever the test left open (see
	// TestFIPSFilesSNIAndClientCA) is cut and named, and the server exits 0.
	p.cmd = exec.Command(bin, append([]string{"--bind-address=127.0.0.1", "--secure-port=0", "--shutdown-timeout=" + shutdownTimeout}, args...)...)
	p.cmd.Dir = t.TempDir()
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.cmd.Env = godebugEnv(godebug)
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { p.stop(t) })

	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if m := servingOn.FindStringSubmatch(p.output.String()); m != nil {
			p.Addr = m[1]
			return p
		}
		select {
		case <-p.exited:
			t.Fatalf("server exited before serving (%v); output:\n%s", p.err, p.output)
		case <-deadline.C:
			t.Fatalf("no 'serving on https://127.0.0.1:PORT' line within %v; output:\n%s", startTimeout, p.output)
		case <-tick.C:
		}
	}
}

func godebugEnv(godebug string) []string {
	if godebug == "" {
		return envWith()
	}
	return envWith("GODEBUG=" + godebug)
}

// stop sends SIGTERM, unless the server has exited already, and waits for
// it to exit 0 (stopTimeout is a hang guard). Connections the shutdown had
// to cut are logged, not failed: the server exits 0 after cutting them.
func (p *serverProc) stop(t *testing.T) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			t.Errorf("server pid %d did not exit cleanly after SIGTERM: %v", p.cmd.Process.Pid, p.err)
		}
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("server pid %d ignored SIGTERM for %v and was killed", p.cmd.Process.Pid, stopTimeout)
	}
	if m := shutdownWarning.FindStringSubmatch(p.Output()); m != nil {
		t.Logf("server pid %d: shutdown cut connections: %s", p.cmd.Process.Pid, m[1])
	}
	if t.Failed() {
		t.Logf("server output:\n%s", p.output)
	}
}

// waitForOutput polls the server's output for substr, for at most
// startTimeout (a guard: log lines of a failed handshake are written after
// the client has seen the failure), and reports whether it appeared.
func (p *serverProc) waitForOutput(substr string) bool {
	deadline := time.Now().Add(startTimeout)
	for !strings.Contains(p.Output(), substr) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// Output returns everything the server wrote so far.
func (p *serverProc) Output() string { return p.output.String() }

// runToExit runs the FIPS server with godebug and args until it exits
// (internal/proctest).
func runToExit(t *testing.T, godebug string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(requireFIPSServer(t), args...)
	cmd.Dir = t.TempDir()
	cmd.Env = godebugEnv(godebug)
	return proctest.RunToExit(t, cmd)
}

// keyKind names the keys the fixtures use, approved or not.
type keyKind string

const (
	keyP256    keyKind = "ecdsa-p256"
	keyP384    keyKind = "ecdsa-p384"
	keyP521    keyKind = "ecdsa-p521"
	keyP224    keyKind = "ecdsa-p224" // not approved
	keyRSA1024 keyKind = "rsa-1024"   // not approved
	keyRSA2048 keyKind = "rsa-2048"
	keyRSA3072 keyKind = "rsa-3072"
	keyEd25519 keyKind = "ed25519"
)

func generateKey(kind keyKind) (crypto.Signer, error) {
	switch kind {
	case keyP256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case keyP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case keyP521:
		return ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case keyP224:
		return ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	case keyRSA1024:
		return rsa.GenerateKey(rand.Reader, 1024)
	case keyRSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case keyRSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	case keyEd25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	}
	return nil, fmt.Errorf("unknown key kind %q", kind)
}

// issue makes a certificate with a key of kind: a CA when ca is nil
// (self-signed, can sign leaves), otherwise a leaf for names (DNS names or
// IPs) signed by ca, usable for server and client auth.
func issue(t testing.TB, ca *pki.Issued, kind keyKind, cn string, names ...string) *pki.Issued {
	t.Helper()
	key, err := generateKey(kind)
	require.NoError(t, err)
	serial, err := pki.NewSerial()
	require.NoError(t, err)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		BasicConstraintsValid: true,
	}
	parent, parentKey := tmpl, key
	if ca == nil {
		tmpl.IsCA, tmpl.MaxPathLenZero = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	} else {
		parent, parentKey = ca.Cert, ca.Key
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		for _, n := range names {
			if ip := net.ParseIP(n); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, n)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	keyPEM, err := pki.EncodeKeyPEM(key)
	require.NoError(t, err)
	return &pki.Issued{Cert: cert, Key: key, CertPEM: pki.EncodeCertPEM(der), KeyPEM: keyPEM}
}

// writePair writes c's certificate and key into dir as name.crt and
// name.key and returns both paths.
func writePair(t testing.TB, dir, name string, c *pki.Issued) (string, string) {
	t.Helper()
	certFile, keyFile := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	require.NoError(t, os.WriteFile(certFile, c.CertPEM, 0o644))
	require.NoError(t, os.WriteFile(keyFile, c.KeyPEM, 0o600))
	return certFile, keyFile
}

// writeBundle writes the certificates of cas into dir/name.
func writeBundle(t testing.TB, dir, name string, cas ...*pki.Issued) string {
	t.Helper()
	var bundle []byte
	for _, ca := range cas {
		bundle = append(bundle, ca.CertPEM...)
	}
	file := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(file, bundle, 0o644))
	return file
}
