// Package posture checks, from the outside, what the example server exposes
// on the wire (TLS versions, cipher suites, key sizes, scanned with sslscan)
// and in its output and files (no private key material). It builds
// ./example/server and runs it as a subprocess on 127.0.0.1.
//
// It needs the sslscan binary: run hack/install-deps.sh.
package posture

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
)

const (
	buildTimeout   = 10 * time.Minute // cold builds on a busy 2-core machine
	startTimeout   = time.Minute
	stopTimeout    = 15 * time.Second
	sslscanTimeout = 3 * time.Minute
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "evercert-posture-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// goTool returns the go command. `go test` puts its own GOROOT/bin first in
// the PATH of test binaries, so this is the toolchain running the tests.
func goTool() string { return "go" }

// serverBinary builds ./example/server once per test binary.
var serverBinary = sync.OnceValues(func() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, goTool(), "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("go env GOMOD: not inside the evercert module")
	}
	bin := filepath.Join(binDir, "server")
	build := exec.CommandContext(ctx, goTool(), "build", "-o", bin, "./example/server")
	build.Dir = filepath.Dir(gomod)
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./example/server: %w\n%s", err, out)
	}
	return bin, nil
})

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
	output *lockedBuffer // stdout and stderr, interleaved
	exited chan struct{} // closed when the process has been reaped
	err    error         // Wait's result, valid after exited
	// Addr is host:port from the "serving on https://HOST:PORT" line.
	Addr string
	// Dir is the server's working directory, a fresh temporary one.
	Dir string
}

var servingOn = regexp.MustCompile(`serving on https://(127\.0\.0\.1:[0-9]+)`)

// startServer runs the example server with args (plus --secure-port=0 and
// --bind-address=127.0.0.1) and waits for its "serving on" log line. The
// process is stopped by pid when the test ends.
func startServer(t *testing.T, args ...string) *serverProc {
	t.Helper()
	bin, err := serverBinary()
	require.NoError(t, err)
	p := &serverProc{output: &lockedBuffer{}, exited: make(chan struct{}), Dir: t.TempDir()}
	p.cmd = exec.Command(bin, append([]string{"--bind-address=127.0.0.1", "--secure-port=0"}, args...)...)
	p.cmd.Dir = p.Dir
	p.cmd.Stdout = p.output
	p.cmd.Stderr = p.output
	p.cmd.Env = append(os.Environ(), "HOME="+p.Dir)
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { p.Stop(t) })

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

// Stop sends SIGTERM to the server's pid, waits for a clean exit, and kills
// it if it does not exit in time. It is idempotent.
func (p *serverProc) Stop(t *testing.T) {
	t.Helper()
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
}

// Output returns everything the server wrote so far.
func (p *serverProc) Output() string { return p.output.String() }

// sslscan XML, as written by sslscan 2.x with --xml=-.
type scanDocument struct {
	XMLName xml.Name   `xml:"document"`
	Version string     `xml:"version,attr"`
	Tests   []scanTest `xml:"ssltest"`
	Errors  []string   `xml:"error"`
}

type scanTest struct {
	Host      string `xml:"host,attr"`
	Port      string `xml:"port,attr"`
	Protocols []struct {
		Type    string `xml:"type,attr"`
		Version string `xml:"version,attr"`
		Enabled string `xml:"enabled,attr"`
	} `xml:"protocol"`
	Renegotiation struct {
		Supported string `xml:"supported,attr"`
		Secure    string `xml:"secure,attr"`
	} `xml:"renegotiation"`
	Heartbleed []struct {
		SSLVersion string `xml:"sslversion,attr"`
		Vulnerable string `xml:"vulnerable,attr"`
	} `xml:"heartbleed"`
	Ciphers []scanCipher `xml:"cipher"`
	Groups  []struct {
		SSLVersion string `xml:"sslversion,attr"`
		Bits       string `xml:"bits,attr"`
		Name       string `xml:"name,attr"`
	} `xml:"group"`
	Certificates []scanCert `xml:"certificates>certificate"`
}

type scanCipher struct {
	Status     string `xml:"status,attr"`
	SSLVersion string `xml:"sslversion,attr"`
	Bits       string `xml:"bits,attr"`
	Cipher     string `xml:"cipher,attr"`
	ID         string `xml:"id,attr"`
	Strength   string `xml:"strength,attr"`
	Curve      string `xml:"curve,attr"`
	ECDHEBits  string `xml:"ecdhebits,attr"`
	DHEBits    string `xml:"dhebits,attr"`
}

type scanCert struct {
	Type               string `xml:"type,attr"`
	SignatureAlgorithm string `xml:"signature-algorithm"`
	PK                 struct {
		Error     string `xml:"error,attr"`
		Type      string `xml:"type,attr"`
		CurveName string `xml:"curve_name,attr"`
		Bits      string `xml:"bits,attr"`
	} `xml:"pk"`
	Subject string `xml:"subject"`
	Expired string `xml:"expired"`
}

// requireSSLScan returns the sslscan binary, or fails the test (it never
// skips: the posture checks are part of the normal test run).
func requireSSLScan(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("sslscan")
	if err != nil {
		t.Fatalf("sslscan is not installed (%v): run hack/install-deps.sh (it installs the Debian package sslscan)", err)
	}
	return bin
}

// sslscan scans addr and returns its one ssltest result.
func sslscan(t *testing.T, addr string) scanTest {
	t.Helper()
	bin := requireSSLScan(t)
	ctx, cancel := context.WithTimeout(context.Background(), sslscanTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--no-colour", "--xml=-", addr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "sslscan %s: %s\n%s", addr, stderr.String(), out)
	i := bytes.Index(out, []byte("<?xml"))
	require.GreaterOrEqual(t, i, 0, "no XML in sslscan output:\n%s", out)
	var doc scanDocument
	require.NoError(t, xml.Unmarshal(out[i:], &doc), "sslscan XML:\n%s", out[i:])
	require.Empty(t, doc.Errors, "sslscan errors")
	require.Len(t, doc.Tests, 1, "sslscan XML:\n%s", out[i:])
	t.Logf("sslscan %s: %d protocols, %d ciphers, %d certificates", doc.Version, len(doc.Tests[0].Protocols), len(doc.Tests[0].Ciphers), len(doc.Tests[0].Certificates))
	return doc.Tests[0]
}

// postureWant is what a scan must show beyond the common rules.
type postureWant struct {
	tls12   bool   // TLS 1.2 enabled (else only TLS 1.3)
	keyType string // "EC" or "RSA"
}

// ecdheAEAD reports whether an OpenSSL TLS 1.2 suite name is ECDHE key exchange
// with an AEAD cipher.
func ecdheAEAD(name string) bool {
	return strings.HasPrefix(name, "ECDHE-") &&
		(strings.Contains(name, "-GCM-") || strings.HasSuffix(name, "-CHACHA20-POLY1305"))
}

// ecCurveBits maps the curve names sslscan (OpenSSL) reports to key sizes.
var ecCurveBits = map[string]int{"prime256v1": 256, "secp256r1": 256, "secp384r1": 384, "secp521r1": 521}

func checkPosture(t *testing.T, scan scanTest, want postureWant) {
	t.Helper()
	enabled := map[string]string{}
	for _, p := range scan.Protocols {
		enabled[p.Type+" "+p.Version] = p.Enabled
	}
	// Every legacy protocol must have been probed and found disabled.
	for _, legacy := range []string{"ssl 2", "ssl 3", "tls 1.0", "tls 1.1"} {
		state, probed := enabled[legacy]
		assert.True(t, probed, "sslscan did not report %s", legacy)
		assert.Equal(t, "0", state, "%s is enabled", legacy)
	}
	assert.Equal(t, "1", enabled["tls 1.3"], "TLS 1.3 must be enabled")
	if want.tls12 {
		assert.Equal(t, "1", enabled["tls 1.2"], "TLS 1.2 must be enabled")
	} else {
		assert.Equal(t, "0", enabled["tls 1.2"], "TLS 1.2 must be disabled with --tls-min-version=VersionTLS13")
	}

	var n12, n13 int
	for _, c := range scan.Ciphers {
		desc := fmt.Sprintf("%s %s (%s)", c.SSLVersion, c.Cipher, c.ID)
		switch c.SSLVersion {
		case "TLSv1.3":
			n13++
		case "TLSv1.2":
			n12++
			assert.True(t, ecdheAEAD(c.Cipher), "TLS 1.2 suite is not ECDHE+AEAD: %s", desc)
			if want.keyType != "" {
				assert.True(t, strings.HasPrefix(c.Cipher, "ECDHE-"+map[string]string{"EC": "ECDSA", "RSA": "RSA"}[want.keyType]+"-"),
					"TLS 1.2 suite does not match the %s certificate: %s", want.keyType, desc)
			}
		default:
			t.Errorf("suite offered on a legacy protocol: %s", desc)
		}
		if bits, err := strconv.Atoi(c.Bits); assert.NoError(t, err, desc) {
			assert.GreaterOrEqual(t, bits, 128, "cipher strength: %s", desc)
		}
		assert.NotContains(t, []string{"null", "anonymous", "weak", "medium"}, c.Strength, "sslscan rates %s %q", desc, c.Strength)
		if c.ECDHEBits != "" {
			bits, err := strconv.Atoi(c.ECDHEBits)
			assert.NoError(t, err, desc)
			assert.GreaterOrEqual(t, bits, 253, "ECDHE group too small (x25519 is 253): %s curve %s", desc, c.Curve)
		}
		if c.DHEBits != "" {
			t.Errorf("finite-field DHE offered: %s (%s bits)", desc, c.DHEBits)
		}
	}
	assert.Positive(t, n13, "no TLS 1.3 suite accepted")
	if want.tls12 {
		assert.Positive(t, n12, "no TLS 1.2 suite accepted")
	} else {
		assert.Zero(t, n12, "TLS 1.2 suites accepted with --tls-min-version=VersionTLS13")
	}
	for _, g := range scan.Groups {
		if bits, err := strconv.Atoi(g.Bits); err == nil {
			assert.GreaterOrEqual(t, bits, 128, "key exchange group %s (%s) below 128-bit security", g.Name, g.SSLVersion)
		}
	}

	for _, h := range scan.Heartbleed {
		assert.Equal(t, "0", h.Vulnerable, "heartbleed on %s", h.SSLVersion)
	}
	assert.False(t, scan.Renegotiation.Supported == "1" && scan.Renegotiation.Secure != "1", "insecure renegotiation supported")

	require.NotEmpty(t, scan.Certificates, "sslscan saw no certificate")
	for _, c := range scan.Certificates {
		assert.Equal(t, "false", c.PK.Error, "sslscan could not read the public key")
		sig := strings.ToLower(c.SignatureAlgorithm)
		assert.False(t, strings.Contains(sig, "md5") || strings.Contains(sig, "sha1"), "weak signature algorithm %s", c.SignatureAlgorithm)
		assert.Equal(t, "false", c.Expired)
		if want.keyType != "" {
			assert.Equal(t, want.keyType, c.PK.Type, "certificate key type")
		}
		switch c.PK.Type {
		case "RSA":
			bits, err := strconv.Atoi(c.PK.Bits)
			assert.NoError(t, err)
			assert.GreaterOrEqual(t, bits, 2048, "RSA key size")
		case "EC":
			bits, known := ecCurveBits[c.PK.CurveName]
			assert.True(t, known, "unknown EC curve %q", c.PK.CurveName)
			assert.GreaterOrEqual(t, bits, 256, "EC key size (curve %s)", c.PK.CurveName)
		default:
			t.Errorf("unexpected certificate key type %q", c.PK.Type)
		}
	}
}

// TestPostureDefault scans the embedded self-signed default (ECDSA P-256)
// with the default TLS settings: TLS 1.2 and 1.3, ECDHE+AEAD suites only.
func TestPostureDefault(t *testing.T) {
	t.Parallel()
	requireSSLScan(t) // before the slow build
	srv := startServer(t, "--ca-bundle-file="+filepath.Join(t.TempDir(), "ca.crt"))
	checkPosture(t, sslscan(t, srv.Addr), postureWant{tls12: true, keyType: "EC"})
}

// TestPostureTLS13Only scans with --tls-min-version=VersionTLS13: TLS 1.2
// must be off.
func TestPostureTLS13Only(t *testing.T) {
	t.Parallel()
	requireSSLScan(t) // before the slow build
	srv := startServer(t, "--ca-bundle-file="+filepath.Join(t.TempDir(), "ca.crt"), "--tls-min-version=VersionTLS13")
	checkPosture(t, sslscan(t, srv.Addr), postureWant{tls12: false, keyType: "EC"})
}

// TestPostureRSA serves an RSA-2048 certificate from files: crypto/tls would
// offer RSA key exchange suites for it by default, the server must not.
func TestPostureRSA(t *testing.T) {
	t.Parallel()
	requireSSLScan(t) // before the slow build
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "posture-ca", KeyType: pki.RSA2048, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{
		CommonName: "localhost", DNSNames: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")},
		KeyType: pki.RSA2048, Now: now, Lifetime: time.Hour,
	})
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certFile, leaf.CertPEM, 0o644))
	require.NoError(t, os.WriteFile(keyFile, leaf.KeyPEM, 0o600))

	srv := startServer(t, "--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile)
	scan := sslscan(t, srv.Addr)
	checkPosture(t, scan, postureWant{tls12: true, keyType: "RSA"})
	for _, c := range scan.Certificates {
		assert.Equal(t, "2048", c.PK.Bits)
	}
	var suites []string
	for _, c := range scan.Ciphers {
		suites = append(suites, c.Cipher)
	}
	assert.False(t, slices.ContainsFunc(suites, func(s string) bool { return strings.HasPrefix(s, "AES") }),
		"static RSA key exchange offered: %v", suites)
}
