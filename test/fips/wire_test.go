//go:build fips

package fips

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ioGuard bounds one network exchange so that a hang fails instead of
// blocking; no test asserts on time.
const ioGuard = 30 * time.Second

// --- sslscan ---

const sslscanTimeout = 3 * time.Minute

// sslscan XML, as written by sslscan 2.x with --xml=-.
type scanDocument struct {
	Tests  []scanTest `xml:"ssltest"`
	Errors []string   `xml:"error"`
}

type scanTest struct {
	Protocols []struct {
		Type    string `xml:"type,attr"`
		Version string `xml:"version,attr"`
		Enabled string `xml:"enabled,attr"`
	} `xml:"protocol"`
	Ciphers []struct {
		SSLVersion string `xml:"sslversion,attr"`
		Cipher     string `xml:"cipher,attr"`
		Curve      string `xml:"curve,attr"`
		DHEBits    string `xml:"dhebits,attr"`
	} `xml:"cipher"`
	Groups []struct {
		SSLVersion string `xml:"sslversion,attr"`
		Name       string `xml:"name,attr"`
	} `xml:"group"`
	ClientCAs    []string `xml:"ca"` // with --show-client-cas
	Certificates []struct {
		SignatureAlgorithm string `xml:"signature-algorithm"`
		PK                 struct {
			Type      string `xml:"type,attr"`
			CurveName string `xml:"curve_name,attr"`
			Bits      string `xml:"bits,attr"`
		} `xml:"pk"`
		Subject string `xml:"subject"`
	} `xml:"certificates>certificate"`
}

func requireSSLScan(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("sslscan")
	if err != nil {
		t.Fatalf("sslscan is not installed (%v): run hack/install-deps.sh (it installs the Debian package sslscan)", err)
	}
	return bin
}

// sslscan scans addr (with SNI name sni, if set) and returns its result
// and the raw XML.
func sslscan(t *testing.T, addr, sni string, extra ...string) (scanTest, string) {
	t.Helper()
	bin := requireSSLScan(t)
	ctx, cancel := context.WithTimeout(context.Background(), sslscanTimeout)
	defer cancel()
	args := append([]string{"--no-colour", "--xml=-"}, extra...)
	if sni != "" {
		args = append(args, "--sni-name="+sni)
	}
	cmd := exec.CommandContext(ctx, bin, append(args, addr)...)
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
	return doc.Tests[0], string(out[i:])
}

// What FIPS 140-3 mode may negotiate, in sslscan's (OpenSSL's) names.
var (
	approvedTLS13Suites   = []string{"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"}
	approvedTLS12Suites   = map[string][]string{"EC": {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384"}, "RSA": {"ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384"}}
	approvedSSLScanGroups = []string{"secp256r1 (NIST P-256)", "secp384r1 (NIST P-384)", "secp521r1 (NIST P-521)"}
	approvedCipherCurves  = []string{"P-256", "P-384", "P-521"}
)

// checkFIPSPosture asserts what sslscan saw: TLS 1.2 and 1.3 only; exactly
// the approved AES-GCM suites for the certificate's key type (sslscan
// probes each suite, ChaCha20-Poly1305 included); ECDHE on NIST curves only
// (no X25519, X448 or finite-field DHE); a certificate of keyType ("EC",
// "RSA" or "ED25519") not signed with SHA-1 or MD5. It returns a one-line
// summary for the log.
func checkFIPSPosture(t *testing.T, scan scanTest, keyType string) string {
	t.Helper()
	var summary []string
	enabled := map[string]string{}
	for _, p := range scan.Protocols {
		enabled[p.Type+" "+p.Version] = p.Enabled
		if p.Enabled == "1" {
			summary = append(summary, p.Type+p.Version)
		}
	}
	for _, proto := range []string{"ssl 2", "ssl 3", "tls 1.0", "tls 1.1"} {
		state, probed := enabled[proto]
		assert.True(t, probed, "sslscan did not report %s", proto)
		assert.Equal(t, "0", state, "%s is enabled in FIPS mode", proto)
	}
	assert.Equal(t, "1", enabled["tls 1.2"], "TLS 1.2")
	assert.Equal(t, "1", enabled["tls 1.3"], "TLS 1.3")

	suites := map[string][]string{}
	for _, c := range scan.Ciphers {
		suites[c.SSLVersion] = append(suites[c.SSLVersion], c.Cipher)
		assert.NotContains(t, strings.ToUpper(c.Cipher), "CHACHA", "ChaCha20 accepted in FIPS mode (%s)", c.SSLVersion)
		assert.Contains(t, approvedCipherCurves, c.Curve, "%s %s used ECDHE curve %q", c.SSLVersion, c.Cipher, c.Curve)
		assert.Empty(t, c.DHEBits, "finite-field DHE: %s %s", c.SSLVersion, c.Cipher)
	}
	for v := range suites {
		slices.Sort(suites[v])
	}
	assert.Equal(t, approvedTLS13Suites, suites["TLSv1.3"], "TLS 1.3 suites")
	want12 := approvedTLS12Suites["EC"] // Ed25519 uses the ECDSA suites
	if keyType == "RSA" {
		want12 = approvedTLS12Suites["RSA"]
	}
	assert.Equal(t, want12, suites["TLSv1.2"], "TLS 1.2 suites for a %s certificate", keyType)
	assert.ElementsMatch(t, []string{"TLSv1.2", "TLSv1.3"}, keys(suites), "suites on other protocol versions")
	summary = append(summary, "TLSv1.3 "+strings.Join(suites["TLSv1.3"], ","), "TLSv1.2 "+strings.Join(suites["TLSv1.2"], ","))

	groups := map[string][]string{}
	for _, g := range scan.Groups {
		groups[g.SSLVersion] = append(groups[g.SSLVersion], g.Name)
		lower := strings.ToLower(g.Name)
		assert.False(t, strings.Contains(lower, "25519") || strings.Contains(lower, "448") || strings.Contains(lower, "ffdhe"),
			"group %s offered on %s in FIPS mode", g.Name, g.SSLVersion)
	}
	for _, v := range []string{"TLSv1.2", "TLSv1.3"} {
		assert.ElementsMatch(t, approvedSSLScanGroups, groups[v], "%s key exchange groups sslscan can see", v)
		summary = append(summary, v+" groups "+strings.Join(groups[v], ","))
	}

	require.NotEmpty(t, scan.Certificates, "sslscan saw no certificate")
	c := scan.Certificates[0]
	if keyType == "ED25519" {
		// sslscan 2.0.7 cannot read Ed25519 keys: <pk error="true" type="unknown"/>.
		assert.Equal(t, "unknown", c.PK.Type, "sslscan learnt to read Ed25519 keys: check for ED25519 here")
	} else {
		assert.Equal(t, keyType, strings.ToUpper(c.PK.Type), "certificate key type")
	}
	sig := strings.ToLower(c.SignatureAlgorithm)
	assert.False(t, strings.Contains(sig, "sha1") || strings.Contains(sig, "md5"), "certificate signed with %s", c.SignatureAlgorithm)
	summary = append(summary, fmt.Sprintf("certificate %s %s%s signed %s", c.Subject, c.PK.Type, c.PK.CurveName, c.SignatureAlgorithm))
	return strings.Join(summary, "; ")
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// --- Go client (this test process runs without FIPS mode, so it can offer
// what the server must refuse) ---

// handshake dials addr with cfg and completes a TLS handshake.
func handshake(addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	d := &net.Dialer{Timeout: ioGuard}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer conn.Close()
	return conn.ConnectionState(), nil
}

// get fetches path over HTTPS with a clone of cfg (HTTP/2 when negotiated)
// and returns the status code, the protocol and the body.
func get(addr, path string, cfg *tls.Config) (int, string, string, error) {
	tr := &http.Transport{TLSClientConfig: cfg.Clone(), ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: ioGuard}
	resp, err := client.Get("https://" + addr + path)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Proto, string(body), err
}

func poolOf(t *testing.T, pemBytes []byte) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pemBytes), "no certificate in bundle")
	return pool
}

// Key exchange groups the server must accept in FIPS mode (TLS 1.3; the
// hybrids with ML-KEM are TLS 1.3 only) and refuse.
var (
	approvedGroups13 = []tls.CurveID{tls.X25519MLKEM768, tls.SecP256r1MLKEM768, tls.SecP384r1MLKEM1024, tls.CurveP256, tls.CurveP384, tls.CurveP521}
	approvedGroups12 = []tls.CurveID{tls.CurveP256, tls.CurveP384, tls.CurveP521}
)

// checkGoClient does real handshakes with a normal (non-FIPS) Go client:
// every approved group negotiates, X25519 alone does not; the approved
// TLS 1.2 suites for the key type negotiate, ChaCha20-Poly1305 and CBC do
// not; TLS 1.1 does not. base carries RootCAs, ServerName and any client
// certificate. It returns a summary for the log.
func checkGoClient(t *testing.T, addr string, base *tls.Config, rsaKey bool) string {
	t.Helper()
	var summary []string
	cfg := func(mod func(*tls.Config)) *tls.Config {
		c := base.Clone()
		mod(c)
		return c
	}

	st, err := handshake(addr, base)
	if assert.NoError(t, err, "default Go client") {
		assert.Equal(t, uint16(tls.VersionTLS13), st.Version)
		assert.Contains(t, approvedGroups13, st.CurveID, "default Go client negotiated %v", st.CurveID)
		summary = append(summary, fmt.Sprintf("default client: %s %s %v", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite), st.CurveID))
	}
	for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		groups := approvedGroups13
		if v == tls.VersionTLS12 {
			groups = approvedGroups12
		}
		for _, g := range groups {
			st, err := handshake(addr, cfg(func(c *tls.Config) { c.MinVersion, c.MaxVersion, c.CurvePreferences = v, v, []tls.CurveID{g} }))
			if assert.NoError(t, err, "%s with only %v", tls.VersionName(v), g) {
				assert.Equal(t, g, st.CurveID)
			}
		}
		_, err := handshake(addr, cfg(func(c *tls.Config) { c.MinVersion, c.MaxVersion, c.CurvePreferences = v, v, []tls.CurveID{tls.X25519} }))
		assert.Error(t, err, "%s with only X25519 negotiated in FIPS mode", tls.VersionName(v))
		summary = append(summary, fmt.Sprintf("%s groups accepted %v, X25519 refused", tls.VersionName(v), groups))
	}

	good := []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384}
	bad := []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA}
	if rsaKey {
		good = []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384}
		bad = []uint16{tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA}
	}
	for _, s := range good {
		st, err := handshake(addr, cfg(func(c *tls.Config) { c.MaxVersion, c.CipherSuites = tls.VersionTLS12, []uint16{s} }))
		if assert.NoError(t, err, "TLS 1.2 %s", tls.CipherSuiteName(s)) {
			assert.Equal(t, s, st.CipherSuite)
		}
	}
	for _, s := range bad {
		_, err := handshake(addr, cfg(func(c *tls.Config) { c.MaxVersion, c.CipherSuites = tls.VersionTLS12, []uint16{s} }))
		assert.Error(t, err, "TLS 1.2 %s negotiated in FIPS mode", tls.CipherSuiteName(s))
	}
	summary = append(summary, fmt.Sprintf("TLS 1.2 suites accepted %s, refused %s", suiteNames(good), suiteNames(bad)))

	_, err = handshake(addr, cfg(func(c *tls.Config) { c.MinVersion, c.MaxVersion = tls.VersionTLS11, tls.VersionTLS11 }))
	assert.Error(t, err, "TLS 1.1 negotiated in FIPS mode")
	return strings.Join(summary, "; ")
}

func suiteNames(ids []uint16) string {
	var names []string
	for _, id := range ids {
		names = append(names, tls.CipherSuiteName(id))
	}
	return strings.Join(names, ",")
}

// --- raw ClientHello prober for signature algorithms ---
//
// sslscan 2.0.7's --show-sigs cannot enumerate signature algorithms of a
// server in FIPS mode: its probe offers only an X25519 key share, the
// server answers with a HelloRetryRequest, and sslscan reads that as
// "accepts all signature algorithms". Go's client does not let a caller
// choose the signature algorithms it offers. So this prober writes a
// ClientHello by hand that offers exactly one signature algorithm, a P-256
// key share and one suite, and reads the answer: in TLS 1.3 a ServerHello
// (the server picks its signature algorithm before it) or an alert; in TLS
// 1.2 a ServerKeyExchange signed with that algorithm or an alert.

// signatureSchemes are the schemes probed, approved or not.
var signatureSchemes = []tls.SignatureScheme{
	tls.PKCS1WithSHA1, tls.ECDSAWithSHA1, 0x0301 /* rsa_pkcs1_sha224 */, 0x0303, /* ecdsa_sha224 */
	tls.PKCS1WithSHA256, tls.PKCS1WithSHA384, tls.PKCS1WithSHA512,
	tls.PSSWithSHA256, tls.PSSWithSHA384, tls.PSSWithSHA512,
	0x0809, 0x080a, 0x080b, /* rsa_pss_pss_* */
	tls.ECDSAWithP256AndSHA256, tls.ECDSAWithP384AndSHA384, tls.ECDSAWithP521AndSHA512,
	tls.Ed25519, 0x0808, /* ed448 */
}

// approvedSignatureSchemes are the ones FIPS 140-3 mode may use (SP 800-140C;
// crypto/tls's allowedSignatureAlgorithmsFIPS).
var approvedSignatureSchemes = []tls.SignatureScheme{
	tls.PSSWithSHA256, tls.PSSWithSHA384, tls.PSSWithSHA512,
	tls.PKCS1WithSHA256, tls.PKCS1WithSHA384, tls.PKCS1WithSHA512,
	tls.ECDSAWithP256AndSHA256, tls.ECDSAWithP384AndSHA384, tls.ECDSAWithP521AndSHA512,
	tls.Ed25519,
}

func u16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func withLen16(b []byte) []byte { return append(u16(uint16(len(b))), b...) }

// clientHello builds a ClientHello record for version (TLS 1.2 or 1.3)
// offering exactly suite, the P-256 group (with a key share in TLS 1.3),
// extended master secret, and sigAlg.
func clientHello(version uint16, suite uint16, sigAlg tls.SignatureScheme, sni string) ([]byte, error) {
	var ext []byte
	add := func(typ uint16, body []byte) {
		ext = append(ext, u16(typ)...)
		ext = append(ext, withLen16(body)...)
	}
	if sni != "" {
		add(0, withLen16(append([]byte{0}, withLen16([]byte(sni))...))) // server_name
	}
	add(10, withLen16(u16(uint16(tls.CurveP256)))) // supported_groups
	add(11, []byte{1, 0})                          // ec_point_formats: uncompressed
	add(13, withLen16(u16(uint16(sigAlg))))        // signature_algorithms
	add(23, nil)                                   // extended_master_secret
	add(0xff01, []byte{0})                         // renegotiation_info
	if version == tls.VersionTLS13 {
		add(43, []byte{2, 3, 4}) // supported_versions: TLS 1.3
		key, err := ecdh.P256().GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		share := append(u16(uint16(tls.CurveP256)), withLen16(key.PublicKey().Bytes())...)
		add(51, withLen16(share)) // key_share
	}
	body := []byte{3, 3} // legacy_version TLS 1.2
	random := make([]byte, 32+32)
	if _, err := rand.Read(random); err != nil {
		return nil, err
	}
	body = append(body, random[:32]...)
	body = append(body, 32)
	body = append(body, random[32:]...) // legacy_session_id
	body = append(body, withLen16(u16(suite))...)
	body = append(body, 1, 0) // compression: null
	body = append(body, withLen16(ext)...)
	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{22, 3, 1}, withLen16(hs)...), nil
}

var helloRetryRandom = []byte{
	0xCF, 0x21, 0xAD, 0x74, 0xE5, 0x9A, 0x61, 0x11, 0xBE, 0x1D, 0x8C, 0x02, 0x1E, 0x65, 0xB8, 0x91,
	0xC2, 0xA2, 0x11, 0x16, 0x7A, 0xBB, 0x8C, 0x5E, 0x07, 0x9E, 0x09, 0xE2, 0xC8, 0xA8, 0x33, 0x9C,
}

// probeSignature reports whether the server at addr accepts a handshake
// whose only signature algorithm is sigAlg.
func probeSignature(addr string, version, suite uint16, sigAlg tls.SignatureScheme, sni string) (bool, error) {
	hello, err := clientHello(version, suite, sigAlg, sni)
	if err != nil {
		return false, err
	}
	conn, err := net.DialTimeout("tcp", addr, ioGuard)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(ioGuard))
	if _, err := conn.Write(hello); err != nil {
		return false, err
	}
	var hs []byte // handshake bytes across records
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
				return false, nil // closed without an answer: refused
			}
			return false, err
		}
		rec := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
		if _, err := io.ReadFull(conn, rec); err != nil {
			return false, err
		}
		switch hdr[0] {
		case 21: // alert
			return false, nil
		case 22: // handshake
			hs = append(hs, rec...)
		default:
			return false, fmt.Errorf("unexpected record type %d before the server's key exchange", hdr[0])
		}
		for len(hs) >= 4 {
			n := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
			if len(hs) < 4+n {
				break
			}
			typ, msg := hs[0], hs[4:4+n]
			hs = hs[4+n:]
			switch {
			case typ == 2 && version == tls.VersionTLS13: // ServerHello
				if len(msg) >= 34 && bytes.Equal(msg[2:34], helloRetryRandom) {
					return false, errors.New("unexpected HelloRetryRequest for a P-256 key share")
				}
				return true, nil
			case typ == 12: // ServerKeyExchange (TLS 1.2 ECDHE)
				if len(msg) < 4 || msg[0] != 3 || len(msg) < 4+int(msg[3])+2 {
					return false, fmt.Errorf("malformed ServerKeyExchange")
				}
				used := tls.SignatureScheme(binary.BigEndian.Uint16(msg[4+int(msg[3]):]))
				if used != sigAlg {
					return false, fmt.Errorf("server signed with %v, offered only %v", used, sigAlg)
				}
				return true, nil
			case typ == 14: // ServerHelloDone without a key exchange
				return false, errors.New("ServerHelloDone without ServerKeyExchange")
			}
		}
	}
}

// probeSignatures returns, per TLS version, the signature schemes the server
// signs its handshake with, offering one at a time, and asserts every one
// is approved. suite12 is the TLS 1.2 suite for the certificate's key.
func probeSignatures(t *testing.T, addr, sni string, suite12 uint16) map[uint16][]tls.SignatureScheme {
	t.Helper()
	accepted := map[uint16][]tls.SignatureScheme{}
	for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		suite := suite12
		if v == tls.VersionTLS13 {
			suite = tls.TLS_AES_128_GCM_SHA256
		}
		for _, s := range signatureSchemes {
			ok, err := probeSignature(addr, v, suite, s, sni)
			require.NoError(t, err, "%s %v", tls.VersionName(v), s)
			if ok {
				accepted[v] = append(accepted[v], s)
				assert.Contains(t, approvedSignatureSchemes, s, "%s: server signs with %v in FIPS mode", tls.VersionName(v), s)
			}
		}
		assert.NotEmpty(t, accepted[v], "%s: no signature algorithm accepted", tls.VersionName(v))
	}
	return accepted
}
