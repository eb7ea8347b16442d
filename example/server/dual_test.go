package main

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// dualClients are the clients of issue 14, each with the key algorithm it
// must be served: a default Go client and openssl with default settings
// get ECDSA; a Go client limited to TLS 1.2 and an RSA cipher suite, and
// openssl on TLS 1.3 offering only RSA-PSS signatures, get RSA.
var dualClients = []struct {
	name string
	want x509.PublicKeyAlgorithm
	dial func(t *testing.T, addr, serverName string, roots *x509.CertPool) (*x509.Certificate, error)
}{
	{"go-default", x509.ECDSA, func(t *testing.T, addr, serverName string, roots *x509.CertPool) (*x509.Certificate, error) {
		return tlstest.Dial(addr, &tls.Config{RootCAs: roots, ServerName: serverName})
	}},
	{"go-tls12-rsa-suite", x509.RSA, func(t *testing.T, addr, serverName string, roots *x509.CertPool) (*x509.Certificate, error) {
		return tlstest.Dial(addr, &tls.Config{RootCAs: roots, ServerName: serverName,
			MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}})
	}},
	{"openssl-tls13-rsa-pss", x509.RSA, func(t *testing.T, addr, serverName string, _ *x509.CertPool) (*x509.Certificate, error) {
		return tlstest.OpenSSL(t, addr, sniOf(serverName), "-tls1_3", "-sigalgs", "rsa_pss_rsae_sha256:rsa_pss_pss_sha256")
	}},
	{"openssl-default", x509.ECDSA, func(t *testing.T, addr, serverName string, _ *x509.CertPool) (*x509.Certificate, error) {
		return tlstest.OpenSSL(t, addr, sniOf(serverName))
	}},
}

// sniOf is the SNI a client sends for serverName: none for an IP.
func sniOf(serverName string) string {
	if net.ParseIP(serverName) != nil {
		return ""
	}
	return serverName
}

// checkDualClients connects with every client, by name and by IP (no SNI),
// and checks it is served a certificate of its algorithm that verifies
// against roots.
func checkDualClients(t *testing.T, addr string, roots *x509.CertPool) {
	t.Helper()
	for _, serverName := range []string{"localhost", "127.0.0.1"} {
		for _, client := range dualClients {
			served, err := client.dial(t, addr, serverName, roots)
			require.NoError(t, err, "%s, %s", client.name, serverName)
			assert.Equal(t, client.want, served.PublicKeyAlgorithm, "%s, %s", client.name, serverName)
			// openssl does not verify; check its certificate here.
			_, err = served.Verify(x509.VerifyOptions{Roots: roots, DNSName: serverName})
			assert.NoError(t, err, "%s, %s: verifies against the CA bundle", client.name, serverName)
		}
	}
}

// TestExampleServerDualSelfSigned runs the example server with
// --self-signed-key-types=ecdsa-p256,rsa-2048: every client gets the
// certificate it supports, and both verify against the CA bundle file.
func TestExampleServerDualSelfSigned(t *testing.T) {
	bundle := filepath.Join(t.TempDir(), "ca.crt")
	addr := startServer(t, "--self-signed-key-types=ecdsa-p256,rsa-2048", "--ca-bundle-file="+bundle)
	pem, err := os.ReadFile(bundle)
	require.NoError(t, err)
	checkDualClients(t, addr, tlstest.Pool(t, pem))

	cfg := &tls.Config{RootCAs: tlstest.Pool(t, pem), ServerName: "localhost"}
	// The status page lists the RSA leaf, with its key algorithm and its
	// renewal time (which is its provider's).
	page := getBody(t, cfg, "https://"+addr+"/")
	assert.Regexp(t, `<tr><td>self-signed/rsa-2048</td><td>serving</td><td>localhost</td><td>RSA</td>`, page)
	assert.Regexp(t, `<tr><td>self-signed/rsa-2048</td>.*<td>[0-9]+h[0-9]+m[0-9]+s</td>`, page)
	assert.Contains(t, getBody(t, cfg, "https://"+addr+"/metrics"), `evercert_certificate_expiration_timestamp_seconds{provider="self-signed/rsa-2048"}`)
}

// TestExampleServerDualFiles serves two file pairs for the same names, an
// ECDSA and an RSA one, as --tls-cert-file and --tls-sni-cert-key, both
// ways round: whichever is the default, a client that sends no SNI gets
// the algorithm it supports.
func TestExampleServerDualFiles(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "dual-files-ca", KeyType: pki.RSA2048, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	pairs := map[string][2]string{}
	for name, kt := range map[string]pki.KeyType{"ecdsa": pki.ECDSAP256, "rsa": pki.RSA2048} {
		leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "localhost", DNSNames: []string{"localhost"},
			IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyType: kt, Now: now, Lifetime: time.Hour})
		require.NoError(t, err)
		pairs[name] = [2]string{write(name+".crt", leaf.CertPEM), write(name+".key", leaf.KeyPEM)}
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, order := range [][2]string{{"ecdsa", "rsa"}, {"rsa", "ecdsa"}} {
		t.Run("default "+order[0]+", sni "+order[1], func(t *testing.T) {
			def, sni := pairs[order[0]], pairs[order[1]]
			addr := startServer(t, "--tls-cert-file="+def[0], "--tls-private-key-file="+def[1], "--tls-sni-cert-key="+sni[0]+","+sni[1])
			checkDualClients(t, addr, roots)
		})
	}
}
