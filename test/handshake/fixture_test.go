package handshake

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/proctest"
)

const (
	exampleServer = "github.com/evercert/evercert/example/server"
	// servingName is the serving certificate's name: no SNI certificate
	// claims it, so every server presents its default certificate.
	servingName = "localhost"
	// sniName is the SNI certificate's name.
	sniName = "sni.test"
)

// servingLine is the line every server logs once it listens.
var servingLine = regexp.MustCompile(`serving on https://([0-9.:\[\]a-f]+)`)

// certs are generated once per test process: ECDSA P-256 throughout, the
// key type of evercert's self-signed default.
type certs struct {
	ca      *pki.Issued // signs the serving and SNI certificates
	serving *pki.Issued
	// sni are two certificates for sniName with different keys; the
	// resumption benchmark alternates them on disk.
	sni      [2]*pki.Issued
	clientCA *pki.Issued
	client   tls.Certificate // signed by clientCA
	roots    *x509.CertPool  // ca
}

var (
	certsOnce sync.Once
	certsErr  error
	fixture   certs
)

func loadCerts(tb testing.TB) *certs {
	tb.Helper()
	certsOnce.Do(func() { certsErr = fixture.generate(time.Now()) })
	if certsErr != nil {
		tb.Fatal(certsErr)
	}
	return &fixture
}

func (c *certs) generate(now time.Time) error {
	var err error
	if c.ca, err = pki.NewCA(pki.Request{CommonName: "handshake-ca", Now: now, Lifetime: 24 * time.Hour}); err != nil {
		return err
	}
	leaf := func(ca *pki.Issued, cn string, dns []string, ips []net.IP) (*pki.Issued, error) {
		return pki.IssueLeaf(ca, pki.Request{CommonName: cn, DNSNames: dns, IPs: ips, Now: now, Lifetime: 12 * time.Hour})
	}
	if c.serving, err = leaf(c.ca, servingName, []string{servingName}, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
		return err
	}
	for i := range c.sni {
		if c.sni[i], err = leaf(c.ca, sniName, []string{sniName}, nil); err != nil {
			return err
		}
	}
	if c.clientCA, err = pki.NewCA(pki.Request{CommonName: "handshake-client-ca", Now: now, Lifetime: 24 * time.Hour}); err != nil {
		return err
	}
	client, err := leaf(c.clientCA, "handshake-client", nil, nil)
	if err != nil {
		return err
	}
	if c.client, err = tls.X509KeyPair(client.CertPEM, client.KeyPEM); err != nil {
		return err
	}
	c.roots = x509.NewCertPool()
	c.roots.AddCert(c.ca.Cert)
	return nil
}

// files are the certificate files all three servers read.
type files struct {
	cert, key       string
	sniCert, sniKey string
	clientCA        string
}

func writeFiles(tb testing.TB, c *certs) files {
	tb.Helper()
	dir := tb.TempDir()
	f := files{
		cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"),
		sniCert: filepath.Join(dir, "sni.crt"), sniKey: filepath.Join(dir, "sni.key"),
		clientCA: filepath.Join(dir, "client-ca.crt"),
	}
	for path, data := range map[string][]byte{
		f.cert: c.serving.CertPEM, f.key: c.serving.KeyPEM,
		f.sniCert: c.sni[0].CertPEM, f.sniKey: c.sni[0].KeyPEM,
		f.clientCA: c.clientCA.CertPEM,
	} {
		writeFile(tb, path, data)
	}
	return f
}

func writeFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// servingArgs are the flags for the serving certificate alone.
func (f files) servingArgs() []string {
	return []string{"--tls-cert-file=" + f.cert, "--tls-private-key-file=" + f.key}
}

// target is one server under measurement.
type target struct {
	name string // evercert, upstream or static
	addr string
	pid  int

	// Totals over the measured connections.
	n       int
	resumed int
	wall    time.Duration
	cpu     time.Duration
}

// startTargets starts the example server and the comparison servers, in
// that order, all with args, and stops them when tb ends. The example
// server runs with its defaults otherwise (its loopback self-check
// included), as users run it.
//
// Every server runs from a binary file of its own, and none from the file
// the client runs from: the comparison servers are copies of this test
// binary, one per kind. Processes that execute the same file share its
// code pages in the page cache, and so the CPU caches holding them: a
// server re-executing the client's own binary found the handshake code
// (X25519, ML-KEM, ECDSA, SHA) warm from the client's half of the same
// handshake, and measured 5-8 % faster than the same server built as a
// separate binary. With one file each, no server shares code with the
// client or with another server.
func startTargets(tb testing.TB, args ...string) []*target {
	tb.Helper()
	bin := proctest.Build(tb, exampleServer)
	p, addr := proctest.Start(tb, bin, servingLine, append([]string{"--secure-port=0"}, args...)...)
	targets := []*target{{name: "evercert", addr: addr, pid: p.Pid()}}
	for _, kind := range []string{kindUpstream, kindStatic, kindLibrary, kindExampleApp} {
		first := []string{serveCommand, "--kind=" + kind}
		if kind == kindExampleApp {
			first = append(first, "--secure-port=0")
		}
		p, addr := proctest.Start(tb, comparisonBinary(tb, kind), servingLine, append(first, args...)...)
		targets = append(targets, &target{name: kind, addr: addr, pid: p.Pid()})
	}
	return targets
}

// comparisonBinary returns a copy of this test binary for the comparison
// server kind, made once per test process next to the binaries
// proctest.Build makes (see startTargets for why each server needs its own
// file).
func comparisonBinary(tb testing.TB, kind string) string {
	tb.Helper()
	dir := proctest.Dir(tb)
	copiesMu.Lock()
	defer copiesMu.Unlock()
	if bin, ok := copies[kind]; ok {
		return bin
	}
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(dir, "handshake-"+kind)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		tb.Fatal(err)
	}
	copies[kind] = bin
	return bin
}

var (
	copiesMu sync.Mutex
	copies   = map[string]string{}
)

// processCPU returns the CPU time the process pid has used so far, the sum
// over its threads of /proc/PID/task/TID/schedstat (nanoseconds, unlike
// /proc/PID/stat's clock ticks). Go threads do not exit while the process
// serves, so no thread's time is lost from the sum.
func processCPU(pid int) (time.Duration, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("reading CPU time: %w", err)
	}
	var total time.Duration
	for _, task := range tasks {
		data, err := os.ReadFile(filepath.Join(dir, task.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		fields := strings.Fields(string(data))
		if len(fields) == 0 {
			return 0, fmt.Errorf("reading CPU time: empty %s/%s/schedstat", dir, task.Name())
		}
		ns, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("reading CPU time: %s/%s/schedstat: %w", dir, task.Name(), err)
		}
		total += time.Duration(ns)
	}
	return total, nil
}
