//go:build fips

package fips

import (
	"crypto/fips140"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	cliflag "k8s.io/component-base/cli/flag"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/server"
)

// childModeEnv names the fips140 mode a child process of this test binary
// runs TestFIPSValidate in.
const childModeEnv = "EVERCERT_FIPS_CHILD_MODE"

// TestFIPSValidate unit-tests server.Options.Validate in each fips140 mode
// and checks evercert's FIPS rules against crypto/tls's real behaviour. The
// mode is fixed when a process starts, so the test runs this test binary
// again under GODEBUG=fips140=only, on and off, and each child runs
// fipsValidateChild.
func TestFIPSValidate(t *testing.T) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		fipsValidateChild(t, mode)
		return
	}
	t.Parallel()
	for _, mode := range []string{"only", "on", "off"} {
		t.Run("fips140="+mode, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestFIPSValidate$", "-test.v", "-test.count=1")
			cmd.Env = envWith("GODEBUG=fips140="+mode, childModeEnv+"="+mode)
			out, err := cmd.CombinedOutput()
			t.Logf("child under GODEBUG=fips140=%s:\n%s", mode, out)
			require.NoError(t, err)
			require.Contains(t, string(out), "--- PASS: TestFIPSValidate ", "the child did not run the test")
		})
	}
}

func fipsValidateChild(t *testing.T, mode string) {
	require.Equal(t, mode != "off", fips140.Enabled(), "fips140.Enabled under GODEBUG=fips140=%s", mode)
	require.Equal(t, mode == "only", fips140.Enforced(), "fips140.Enforced under GODEBUG=fips140=%s", mode)
	fipsMode := mode != "off"
	godebug := "(GODEBUG=fips140=" + mode + ")"

	dir := t.TempDir()
	var weakCA, goodCA, rsaCA *pki.Issued
	var rsa1024Cert, rsa1024Key, p224Cert, p224Key, ed25519Cert, ed25519Key, rsaCert, rsaKey, p521Cert, p521Key string
	// fips140=only refuses to make these keys and certificates; they are
	// test fixtures, not served by this process.
	fips140.WithoutEnforcement(func() {
		weakCA = issue(t, nil, keyRSA1024, "weak-ca")
		goodCA = issue(t, nil, keyP256, "good-ca")
		rsaCA = issue(t, nil, keyRSA2048, "rsa-ca")
		rsa1024Cert, rsa1024Key = writePair(t, dir, "rsa1024", issue(t, weakCA, keyRSA1024, "rsa1024.test", "rsa1024.test"))
		p224Cert, p224Key = writePair(t, dir, "p224", issue(t, goodCA, keyP224, "p224.test", "p224.test"))
		ed25519Cert, ed25519Key = writePair(t, dir, "ed25519", issue(t, goodCA, keyEd25519, "ed25519.test", "ed25519.test"))
		rsaCert, rsaKey = writePair(t, dir, "rsa3072", issue(t, rsaCA, keyRSA3072, "rsa.test", "rsa.test"))
		p521Cert, p521Key = writePair(t, dir, "p521", issue(t, goodCA, keyP521, "p521.test", "p521.test"))
	})

	t.Run("default suites", func(t *testing.T) {
		hasChaCha := slices.ContainsFunc(server.DefaultCipherSuites, func(s string) bool { return strings.Contains(s, "CHACHA20") })
		assert.Equal(t, !fipsMode, hasChaCha, "ChaCha20 in DefaultCipherSuites %v", server.DefaultCipherSuites)
		assert.Empty(t, server.NewOptions().Validate(), "the defaults must validate")
		o := server.NewOptions()
		o.MinTLSVersion = "VersionTLS13"
		assert.Empty(t, o.Validate())
	})

	const aes128 = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
	for _, tc := range []struct {
		name string
		set  func(*server.Options)
		want []string // error substrings in FIPS mode; none outside it
	}{
		{"approved suites", func(o *server.Options) {
			o.CipherSuites = []string{aes128, "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"}
		}, nil},
		{"ChaCha20", func(o *server.Options) {
			o.CipherSuites = []string{aes128, "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"}
		}, []string{"--tls-cipher-suites: TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 not approved in FIPS 140-3 mode " + godebug + "; approved: "}},
		{"CBC-SHA", func(o *server.Options) { o.CipherSuites = []string{aes128, "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"} },
			[]string{"--tls-cipher-suites: TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA not approved"}},
		{"TLS 1.3 ChaCha20 name", func(o *server.Options) { o.CipherSuites = []string{aes128, "TLS_CHACHA20_POLY1305_SHA256"} },
			[]string{"--tls-cipher-suites: TLS_CHACHA20_POLY1305_SHA256 not approved"}},
		{"ChaCha20 with TLS 1.3 minimum", func(o *server.Options) {
			o.MinTLSVersion, o.CipherSuites = "VersionTLS13", []string{"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"}
		}, []string{"--tls-cipher-suites: TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 not approved"}},
		{"TLS 1.0", func(o *server.Options) { o.MinTLSVersion = "VersionTLS10" },
			[]string{"--tls-min-version: VersionTLS10 is not approved in FIPS 140-3 mode " + godebug}},
		{"RSA-1024 file", func(o *server.Options) { o.CertFile, o.KeyFile = rsa1024Cert, rsa1024Key },
			[]string{"--tls-cert-file " + rsa1024Cert + `: certificate 1 (subject "CN=rsa1024.test"): not approved in FIPS 140-3 mode: RSA 1024-bit key (RSA needs at least 2048 bits) ` + godebug}},
		{"P-224 SNI", func(o *server.Options) {
			o.SNICertKeys = []cliflag.NamedCertKey{{CertFile: ed25519Cert, KeyFile: ed25519Key}, {CertFile: p224Cert, KeyFile: p224Key}}
		}, []string{"--tls-sni-cert-key[1] " + p224Cert + `: certificate 1 (subject "CN=p224.test"): not approved in FIPS 140-3 mode: ECDSA key on P-224`}},
		{"approved files: RSA-3072, P-521, Ed25519", func(o *server.Options) {
			o.CertFile, o.KeyFile = rsaCert, rsaKey
			o.SNICertKeys = []cliflag.NamedCertKey{{CertFile: p521Cert, KeyFile: p521Key}, {CertFile: ed25519Cert, KeyFile: ed25519Key}}
			o.ClientCAFile = writeBundle(t, dir, "good-cas.crt", goodCA, rsaCA)
		}, nil},
		{"RSA-1024 client CA", func(o *server.Options) { o.ClientCAFile = writeBundle(t, dir, "cas.crt", goodCA, weakCA) },
			[]string{"--client-ca-file " + dir + `/cas.crt: certificate 2 (subject "CN=weak-ca"): not approved in FIPS 140-3 mode: RSA 1024-bit key`}},
		{"missing files are left to the loaders", func(o *server.Options) {
			o.CertFile, o.KeyFile, o.ClientCAFile = dir+"/missing.crt", dir+"/missing.key", dir+"/missing-ca.crt"
		}, nil},
		{"every problem at once", func(o *server.Options) {
			o.MinTLSVersion = "VersionTLS11"
			o.CipherSuites = []string{aes128, "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"}
			o.CertFile, o.KeyFile = rsa1024Cert, rsa1024Key
			o.SNICertKeys = []cliflag.NamedCertKey{{CertFile: p224Cert, KeyFile: p224Key}}
			o.ClientCAFile = writeBundle(t, dir, "weak.crt", weakCA)
		}, []string{"--tls-min-version: ", "--tls-cipher-suites: ", "--tls-cert-file ", "--tls-sni-cert-key[0] ", "--client-ca-file "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := server.NewOptions()
			tc.set(o)
			errs := o.Validate()
			if !fipsMode || len(tc.want) == 0 {
				assert.Empty(t, errs)
				return
			}
			require.Len(t, errs, len(tc.want), "one error per problem: %v", errs)
			for i, w := range tc.want {
				assert.Contains(t, errs[i].Error(), w)
			}
		})
	}

	if fipsMode {
		t.Run("approved suites match crypto/tls", func(t *testing.T) { checkSuitesMatchCryptoTLS(t) })
		t.Run("approved keys match crypto/tls", func(t *testing.T) { checkKeysMatchCryptoTLS(t) })
	}
}

// pipeHandshake runs a TLS handshake between server and client configs of
// this process over net.Pipe (no network).
func pipeHandshake(serverCfg, clientCfg *tls.Config) (tls.ConnectionState, error) {
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	srv := tls.Server(s, serverCfg)
	done := make(chan error, 1)
	go func() {
		err := srv.Handshake()
		if err != nil {
			s.Close() // unblock the client
		}
		done <- err
	}()
	cli := tls.Client(c, clientCfg)
	cerr := cli.Handshake()
	if cerr != nil {
		c.Close()
	}
	serr := <-done
	if err := errors.Join(cerr, serr); err != nil {
		return tls.ConnectionState{}, err
	}
	return cli.ConnectionState(), nil
}

// checkSuitesMatchCryptoTLS: every TLS 1.2 suite evercert accepts in FIPS
// mode negotiates in crypto/tls's FIPS mode (both ends of an in-process
// handshake in this FIPS-mode child), and every suite crypto/tls allows
// that evercert refuses is one of Go's insecure suites (CBC with SHA-256).
func checkSuitesMatchCryptoTLS(t *testing.T) {
	ca := issue(t, nil, keyP256, "suite-ca")
	ecLeaf := issue(t, ca, keyP256, "suites.test", "suites.test")
	rsaLeaf := issue(t, ca, keyRSA2048, "suites.test", "suites.test")
	var certs []tls.Certificate
	for _, l := range []*pki.Issued{ecLeaf, rsaLeaf} {
		pair, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
		require.NoError(t, err)
		certs = append(certs, pair)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	var goAllows, evercertAllows []string
	for _, s := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		if !slices.Contains(s.SupportedVersions, tls.VersionTLS12) {
			continue
		}
		o := server.NewOptions()
		o.CipherSuites = []string{s.Name, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}
		evercert := len(o.Validate()) == 0
		_, err := pipeHandshake(
			&tls.Config{Certificates: certs, CipherSuites: []uint16{s.ID}, MaxVersion: tls.VersionTLS12},
			&tls.Config{RootCAs: roots, ServerName: "suites.test", CipherSuites: []uint16{s.ID}, MaxVersion: tls.VersionTLS12})
		goOK := err == nil
		if goOK {
			goAllows = append(goAllows, s.Name)
		}
		if evercert {
			evercertAllows = append(evercertAllows, s.Name)
			assert.True(t, goOK, "evercert accepts %s but crypto/tls in FIPS mode does not negotiate it: %v", s.Name, err)
		} else if goOK {
			assert.True(t, s.Insecure, "crypto/tls negotiates %s in FIPS mode but evercert refuses it without it being insecure", s.Name)
		}
	}
	t.Logf("TLS 1.2 suites crypto/tls negotiates in FIPS mode: %v", goAllows)
	t.Logf("TLS 1.2 suites evercert accepts in FIPS mode: %v", evercertAllows)
	assert.NotEmpty(t, evercertAllows)
}

// checkKeysMatchCryptoTLS: for each key kind, pki.CheckFIPSKeyPair approves
// it exactly when a TLS 1.3 handshake serving and verifying it succeeds in
// crypto/tls's FIPS mode.
func checkKeysMatchCryptoTLS(t *testing.T) {
	for _, kind := range []keyKind{keyP256, keyP384, keyP521, keyP224, keyRSA1024, keyRSA2048, keyRSA3072, keyEd25519} {
		var ca, leaf *pki.Issued
		fips140.WithoutEnforcement(func() {
			ca = issue(t, nil, kind, string(kind)+"-ca")
			leaf = issue(t, ca, kind, "keys.test", "keys.test")
		})
		pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
		require.NoError(t, err)
		approved := pki.CheckFIPSKeyPair(pair) == nil
		roots := x509.NewCertPool()
		roots.AddCert(ca.Cert)
		_, err = pipeHandshake(&tls.Config{Certificates: []tls.Certificate{pair}}, &tls.Config{RootCAs: roots, ServerName: "keys.test"})
		assert.Equal(t, approved, err == nil, "%s: evercert approves=%v, crypto/tls handshake error: %v", kind, approved, err)
		t.Logf("%s: approved=%v handshake error=%v", kind, approved, err)
	}
}
