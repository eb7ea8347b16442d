package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/tlstest"
)

// testNow is the fixed "now" of every test and fuzz target here, so results
// never depend on the wall clock. Certificate times have second precision.
var testNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// sentinels are every error ParseCertKey and ParseCABundle may wrap.
var sentinels = []error{
	ErrEmpty, ErrTooLarge, ErrMalformedPEM, ErrEncryptedKey, ErrKeyMismatch,
	ErrExpired, ErrNotYetValid, ErrNotServingCert, ErrBrokenChain,
}

// fixture is a CA and a leaf it signed, issued at testNow.
type fixture struct {
	ca, leaf *Issued
}

// fixtures issues one CA+leaf per key type once per test binary: RSA-3072
// keys are slow to make, and the fuzz seeds need them too. The leaf has the
// key type; the CA is RSA-2048 for RSA2048 (to cover RSA signing) and
// ECDSA P-256 otherwise.
var fixtures = sync.OnceValues(func() (map[KeyType]*fixture, error) {
	out := map[KeyType]*fixture{}
	for _, kt := range KeyTypes {
		caType := ECDSAP256
		if kt == RSA2048 {
			caType = RSA2048
		}
		ca, err := NewCA(Request{CommonName: string(kt) + "-ca", KeyType: caType, Now: testNow, Lifetime: 365 * 24 * time.Hour})
		if err != nil {
			return nil, err
		}
		leaf, err := IssueLeaf(ca, Request{
			CommonName: "leaf.test", DNSNames: []string{"leaf.test", "*.wild.test"},
			IPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}, KeyType: kt,
			Now: testNow, Lifetime: 30 * 24 * time.Hour,
		})
		if err != nil {
			return nil, err
		}
		out[kt] = &fixture{ca: ca, leaf: leaf}
	}
	return out, nil
})

func fixtureFor(tb testing.TB, kt KeyType) *fixture {
	tb.Helper()
	all, err := fixtures()
	require.NoError(tb, err)
	return all[kt]
}

// chainFixture is root -> intermediate -> leaf; ca holds the root, and
// the leaf's CertPEM is the leaf followed by the intermediate.
var chainFixture = sync.OnceValues(func() (*fixture, error) {
	chain, err := tlstest.NewChain(testNow, "chain")
	if err != nil {
		return nil, err
	}
	leaf, err := chain.Issue(testNow, time.Hour, "chained.test")
	if err != nil {
		return nil, err
	}
	return &fixture{
		ca:   &Issued{Cert: chain.Root, CertPEM: chain.RootPEM},
		leaf: &Issued{Cert: leaf.Cert, CertPEM: leaf.CertPEM, KeyPEM: leaf.KeyPEM},
	}, nil
})

// customLeaf self-signs a one-hour leaf for a fixed P-256 key after mutate
// has edited the template.
var customKey = sync.OnceValues(func() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) })

func customLeaf(tb testing.TB, mutate func(*x509.Certificate)) (certPEM, keyPEM []byte) {
	tb.Helper()
	key, err := customKey()
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42), Subject: pkix.Name{CommonName: "custom.test"}, DNSNames: []string{"custom.test"},
		NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if mutate != nil {
		mutate(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(tb, err)
	keyPEM, err = EncodeKeyPEM(key)
	require.NoError(tb, err)
	return EncodeCertPEM(der), keyPEM
}

func join(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// ecParamsKeyPEM is the fixture P-256 leaf's key as `openssl ecparam
// -genkey` writes it: an EC PARAMETERS block, then a SEC 1 EC PRIVATE KEY.
func ecParamsKeyPEM(tb testing.TB, key crypto.Signer) []byte {
	tb.Helper()
	sec1, err := x509.MarshalECPrivateKey(key.(*ecdsa.PrivateKey))
	require.NoError(tb, err)
	params, err := asn1.Marshal(asn1.ObjectIdentifier{1, 2, 840, 10045, 3, 1, 7}) // prime256v1
	require.NoError(tb, err)
	return join(
		pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: params}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}),
	)
}

// parseCase is one ParseCertKey input and its expected outcome; want nil
// means success. The table is shared with the fuzz seed corpus.
type parseCase struct {
	name      string
	cert, key []byte
	now       time.Time
	want      error
	// large marks inputs over MaxPEMSize, kept out of the fuzz corpus.
	large bool
}

func parseCases(tb testing.TB) []parseCase {
	tb.Helper()
	p256 := fixtureFor(tb, ECDSAP256)
	p384 := fixtureFor(tb, ECDSAP384)
	rsa2048 := fixtureFor(tb, RSA2048)
	chain, err := chainFixture()
	require.NoError(tb, err)

	otherP256, err := IssueLeaf(p256.ca, Request{CommonName: "other.test", Now: testNow, Lifetime: time.Hour})
	require.NoError(tb, err)
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsa2048.leaf.Key.(*rsa.PrivateKey))})
	procTypeEncrypted := pem.EncodeToMemory(&pem.Block{
		Type:    "RSA PRIVATE KEY",
		Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-256-CBC,00112233445566778899AABBCCDDEEFF"},
		Bytes:   bytes.Repeat([]byte{0x5a}, 64),
	})
	pkcs8Encrypted := pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: bytes.Repeat([]byte{0xa5}, 64)})
	garbageCertBlock := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("this is not DER")})
	garbageKeyBlock := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("this is not DER")})
	publicKeyBlock := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2, 3}})
	badBase64 := []byte("-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n")
	noEKUCert, noEKUKey := customLeaf(tb, func(c *x509.Certificate) { c.ExtKeyUsage = nil })
	anyEKUCert, anyEKUKey := customLeaf(tb, func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageAny} })
	clientCert, clientKey := customLeaf(tb, func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} })
	codeSignCert, codeSignKey := customLeaf(tb, func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning, x509.ExtKeyUsageClientAuth}
	})
	leaf := p256.leaf
	ecParams := ecParamsKeyPEM(tb, leaf.Key)
	ecParamsOnly := ecParams[:bytes.Index(ecParams, []byte("-----BEGIN EC PRIVATE KEY"))]
	pad := bytes.Repeat([]byte{' '}, MaxPEMSize)
	// The chain fixture's parts: leaf, intermediate, root.
	chainLeaf := EncodeCertPEM(chain.leaf.Cert.Raw)
	chainInter := chain.leaf.CertPEM[len(chainLeaf):]
	chainRoot := chain.ca.CertPEM
	// A CA with the same name as the P-256 leaf's issuer but another key:
	// the names chain, the signature does not.
	impostor, err := NewCA(Request{CommonName: p256.ca.Cert.Subject.CommonName, Now: testNow, Lifetime: time.Hour})
	require.NoError(tb, err)

	cases := []parseCase{
		{name: "valid/rsa pkcs1 key", cert: rsa2048.leaf.CertPEM, key: pkcs1, now: testNow},
		{name: "valid/zero now skips dates", cert: leaf.CertPEM, key: leaf.KeyPEM},
		{name: "valid/now at NotAfter", cert: leaf.CertPEM, key: leaf.KeyPEM, now: leaf.Cert.NotAfter},
		{name: "valid/now at NotBefore", cert: leaf.CertPEM, key: leaf.KeyPEM, now: leaf.Cert.NotBefore},
		{name: "valid/trailing white space", cert: join(leaf.CertPEM, []byte("\n\n \t\r\n")), key: join(leaf.KeyPEM, []byte("\n  ")), now: testNow},
		{name: "valid/text before first block", cert: join([]byte("Bag Attributes\n    localKeyID: 01 02 03\nsubject=/CN=leaf.test\nissuer=/CN=ca\n"), leaf.CertPEM), key: join([]byte("Key Attributes: <No Attributes>\n"), leaf.KeyPEM), now: testNow},
		{name: "valid/CRLF line endings", cert: bytes.ReplaceAll(leaf.CertPEM, []byte("\n"), []byte("\r\n")), key: bytes.ReplaceAll(leaf.KeyPEM, []byte("\n"), []byte("\r\n")), now: testNow},
		{name: "valid/EC PARAMETERS before EC PRIVATE KEY", cert: leaf.CertPEM, key: ecParams, now: testNow},
		{name: "valid/chain leaf+intermediate", cert: chain.leaf.CertPEM, key: chain.leaf.KeyPEM, now: testNow},
		{name: "valid/chain leaf+intermediate+root", cert: join(chainLeaf, chainInter, chainRoot), key: chain.leaf.KeyPEM, now: testNow},
		{name: "valid/leaf+its CA", cert: join(leaf.CertPEM, p256.ca.CertPEM), key: leaf.KeyPEM, now: testNow},
		{name: "valid/no EKU", cert: noEKUCert, key: noEKUKey, now: testNow},
		{name: "valid/any EKU", cert: anyEKUCert, key: anyEKUKey, now: testNow},

		{name: "empty/cert nil", cert: nil, key: leaf.KeyPEM, want: ErrEmpty},
		{name: "empty/key empty", cert: leaf.CertPEM, key: []byte{}, want: ErrEmpty},
		{name: "empty/cert white space", cert: []byte(" \n\t\r\n "), key: leaf.KeyPEM, want: ErrEmpty},
		{name: "empty/key white space", cert: leaf.CertPEM, key: []byte("\n\n"), want: ErrEmpty},
		{name: "too large/cert", cert: join(leaf.CertPEM, pad), key: leaf.KeyPEM, want: ErrTooLarge, large: true},
		{name: "too large/key", cert: leaf.CertPEM, key: join(leaf.KeyPEM, pad), want: ErrTooLarge, large: true},
		{name: "malformed/cert not PEM", cert: []byte("not a certificate"), key: leaf.KeyPEM, want: ErrMalformedPEM},
		{name: "malformed/key not PEM", cert: leaf.CertPEM, key: []byte("not a key"), want: ErrMalformedPEM},
		{name: "malformed/bad base64", cert: badBase64, key: leaf.KeyPEM, want: ErrMalformedPEM},
		{name: "malformed/truncated cert PEM", cert: leaf.CertPEM[:len(leaf.CertPEM)/2], key: leaf.KeyPEM, want: ErrMalformedPEM},
		{name: "malformed/truncated key PEM", cert: leaf.CertPEM, key: leaf.KeyPEM[:len(leaf.KeyPEM)-10], want: ErrMalformedPEM},
		{name: "malformed/cert DER garbage", cert: garbageCertBlock, key: leaf.KeyPEM, want: ErrMalformedPEM},
		{name: "malformed/key DER garbage", cert: leaf.CertPEM, key: garbageKeyBlock, want: ErrMalformedPEM},
		{name: "trailing garbage/cert", cert: join(leaf.CertPEM, []byte("garbage")), key: leaf.KeyPEM, want: ErrMalformedPEM},
		{name: "trailing garbage/key", cert: leaf.CertPEM, key: join(leaf.KeyPEM, []byte("x\n")), want: ErrMalformedPEM},
		{name: "wrong block/key in cert file", cert: leaf.KeyPEM, key: leaf.KeyPEM, want: ErrMalformedPEM},
		{name: "wrong block/cert in key file", cert: leaf.CertPEM, key: leaf.CertPEM, want: ErrMalformedPEM},
		{name: "wrong block/cert and key in cert file", cert: join(leaf.CertPEM, leaf.KeyPEM), key: leaf.KeyPEM, want: ErrMalformedPEM},
		{name: "wrong block/public key in key file", cert: leaf.CertPEM, key: publicKeyBlock, want: ErrMalformedPEM},
		{name: "wrong block/EC PARAMETERS only", cert: leaf.CertPEM, key: ecParamsOnly, want: ErrMalformedPEM},
		{name: "encrypted/Proc-Type header", cert: rsa2048.leaf.CertPEM, key: procTypeEncrypted, want: ErrEncryptedKey},
		{name: "encrypted/ENCRYPTED PRIVATE KEY", cert: leaf.CertPEM, key: pkcs8Encrypted, want: ErrEncryptedKey},
		{name: "mismatch/RSA key with ECDSA cert", cert: leaf.CertPEM, key: rsa2048.leaf.KeyPEM, want: ErrKeyMismatch},
		{name: "mismatch/ECDSA key with RSA cert", cert: rsa2048.leaf.CertPEM, key: leaf.KeyPEM, want: ErrKeyMismatch},
		{name: "mismatch/P-384 key with P-256 cert", cert: leaf.CertPEM, key: p384.leaf.KeyPEM, want: ErrKeyMismatch},
		{name: "mismatch/other P-256 key", cert: leaf.CertPEM, key: otherP256.KeyPEM, want: ErrKeyMismatch},
		{name: "mismatch/CA cert with leaf key", cert: p256.ca.CertPEM, key: leaf.KeyPEM, want: ErrKeyMismatch},
		{name: "dates/expired", cert: leaf.CertPEM, key: leaf.KeyPEM, now: leaf.Cert.NotAfter.Add(time.Second), want: ErrExpired},
		{name: "dates/not yet valid", cert: leaf.CertPEM, key: leaf.KeyPEM, now: leaf.Cert.NotBefore.Add(-time.Second), want: ErrNotYetValid},
		{name: "chain/root before intermediate", cert: join(chainLeaf, chainRoot, chainInter), key: chain.leaf.KeyPEM, now: testNow, want: ErrBrokenChain},
		{name: "chain/root without intermediate", cert: join(chainLeaf, chainRoot), key: chain.leaf.KeyPEM, now: testNow, want: ErrBrokenChain},
		{name: "chain/unrelated CA appended", cert: join(leaf.CertPEM, rsa2048.ca.CertPEM), key: leaf.KeyPEM, now: testNow, want: ErrBrokenChain},
		{name: "chain/same-name CA with another key", cert: join(leaf.CertPEM, impostor.CertPEM), key: leaf.KeyPEM, now: testNow, want: ErrBrokenChain},
		{name: "chain/leaf twice", cert: join(leaf.CertPEM, leaf.CertPEM), key: leaf.KeyPEM, now: testNow, want: ErrBrokenChain},
		{name: "chain/intermediate first", cert: join(chainInter, chainLeaf), key: chain.leaf.KeyPEM, now: testNow, want: ErrKeyMismatch},
		{name: "chain/garbage intermediate", cert: join(leaf.CertPEM, garbageCertBlock), key: leaf.KeyPEM, now: testNow, want: ErrMalformedPEM},
		{name: "eku/client auth only", cert: clientCert, key: clientKey, now: testNow, want: ErrNotServingCert},
		{name: "eku/code signing and client auth", cert: codeSignCert, key: codeSignKey, now: testNow, want: ErrNotServingCert},
	}
	for _, kt := range KeyTypes {
		f := fixtureFor(tb, kt)
		cases = append(cases, parseCase{name: "valid/" + string(kt), cert: f.leaf.CertPEM, key: f.leaf.KeyPEM, now: testNow})
	}
	return cases
}

// assertNoKeyMaterial checks that a parse error message is useful and safe
// to log: not empty, and without PEM armor or any encoding of the keys.
func assertNoKeyMaterial(t testing.TB, err error, keys ...[]byte) {
	t.Helper()
	msg := err.Error()
	assert.NotEmpty(t, msg)
	assert.NotContains(t, msg, "-----BEGIN")
	assert.NotContains(t, msg, "-----END")
	for _, keyPEM := range keys {
		for rest := keyPEM; ; {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				break
			}
			if len(block.Bytes) >= 8 {
				assert.NotContains(t, msg, string(block.Bytes[:8]), "raw key bytes in error")
				assert.NotContains(t, msg, hex.EncodeToString(block.Bytes[:8]), "hex key bytes in error")
			}
		}
		for _, line := range strings.Split(string(keyPEM), "\n") {
			line = strings.TrimSpace(line)
			if len(line) >= 16 && !strings.HasPrefix(line, "-----") && !strings.Contains(line, ":") {
				assert.NotContains(t, msg, line[:16], "base64 key material in error")
			}
		}
	}
}

func TestGenerateKey(t *testing.T) {
	for _, tc := range []struct {
		kt    KeyType
		curve elliptic.Curve
		bits  int
	}{
		{"", elliptic.P256(), 0},
		{ECDSAP256, elliptic.P256(), 0},
		{ECDSAP384, elliptic.P384(), 0},
		{RSA2048, nil, 2048},
		{RSA3072, nil, 3072},
	} {
		t.Run(string(tc.kt), func(t *testing.T) {
			key, err := GenerateKey(tc.kt)
			require.NoError(t, err)
			switch k := key.(type) {
			case *ecdsa.PrivateKey:
				require.NotNil(t, tc.curve, "got ECDSA, want RSA")
				assert.Equal(t, tc.curve, k.Curve)
			case *rsa.PrivateKey:
				require.NotZero(t, tc.bits, "got RSA, want ECDSA")
				assert.Equal(t, tc.bits, k.N.BitLen())
				assert.NoError(t, k.Validate())
			default:
				t.Fatalf("unexpected key type %T", key)
			}
			keyPEM, err := EncodeKeyPEM(key)
			require.NoError(t, err)
			block, rest := pem.Decode(keyPEM)
			require.NotNil(t, block)
			assert.Empty(t, rest)
			assert.Equal(t, "PRIVATE KEY", block.Type)
			parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			require.NoError(t, err)
			assert.True(t, parsed.(crypto.Signer).Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(key.Public()))
		})
	}
	_, err := GenerateKey("dsa-1024")
	assert.ErrorContains(t, err, "dsa-1024")
}

func TestNewSerial(t *testing.T) {
	limit := new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), 128), big.NewInt(1))
	seen := map[string]bool{}
	for range 1000 {
		s, err := NewSerial()
		require.NoError(t, err)
		require.Equal(t, 1, s.Sign(), "serial must be positive")
		require.Equal(t, -1, s.Cmp(limit), "serial must be < 2^128+1")
		require.False(t, seen[s.String()], "duplicate serial")
		seen[s.String()] = true
	}
}

func TestNewCA(t *testing.T) {
	for _, kt := range []KeyType{ECDSAP256, RSA2048} {
		t.Run(string(kt), func(t *testing.T) {
			ca, err := NewCA(Request{CommonName: "my-ca", KeyType: kt, Now: testNow, Lifetime: 48 * time.Hour})
			require.NoError(t, err)
			c := ca.Cert
			assert.Equal(t, "my-ca", c.Subject.CommonName)
			assert.True(t, c.IsCA)
			assert.True(t, c.BasicConstraintsValid)
			assert.True(t, c.MaxPathLenZero)
			assert.Equal(t, 0, c.MaxPathLen)
			assert.NotZero(t, c.KeyUsage&x509.KeyUsageCertSign)
			assert.Equal(t, testNow.Add(-ClockSkew), c.NotBefore)
			assert.Equal(t, testNow.Add(48*time.Hour), c.NotAfter)
			assert.Equal(t, 1, c.SerialNumber.Sign())
			assert.NoError(t, c.CheckSignatureFrom(c), "self-signed")
			assert.True(t, ca.Key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(c.PublicKey))

			block, rest := pem.Decode(ca.CertPEM)
			require.NotNil(t, block)
			assert.Empty(t, rest)
			assert.Equal(t, "CERTIFICATE", block.Type)
			assert.Equal(t, c.Raw, block.Bytes)
			block, _ = pem.Decode(ca.KeyPEM)
			require.NotNil(t, block)
			assert.Equal(t, "PRIVATE KEY", block.Type)

			// A CA is not a serving certificate on its own, but the pair
			// parses (no EKU means any).
			kp, err := ParseCertKey(ca.CertPEM, ca.KeyPEM, testNow)
			require.NoError(t, err)
			assert.Equal(t, c.Raw, kp.Leaf.Raw)
		})
	}

	a, err := NewCA(Request{CommonName: "a", Now: testNow, Lifetime: time.Hour})
	require.NoError(t, err)
	b, err := NewCA(Request{CommonName: "a", Now: testNow, Lifetime: time.Hour})
	require.NoError(t, err)
	assert.NotEqual(t, a.Cert.SerialNumber, b.Cert.SerialNumber)

	for name, r := range map[string]Request{
		"zero lifetime":     {CommonName: "x", Now: testNow},
		"negative lifetime": {CommonName: "x", Now: testNow, Lifetime: -time.Hour},
		"zero now":          {CommonName: "x", Lifetime: time.Hour},
		"unknown key type":  {CommonName: "x", Now: testNow, Lifetime: time.Hour, KeyType: "dsa"},
	} {
		_, err := NewCA(r)
		assert.Error(t, err, name)
	}
}

func TestIssueLeaf(t *testing.T) {
	for _, kt := range KeyTypes {
		t.Run(string(kt), func(t *testing.T) {
			f := fixtureFor(t, kt)
			c := f.leaf.Cert
			assert.Equal(t, "leaf.test", c.Subject.CommonName)
			assert.False(t, c.IsCA)
			assert.ElementsMatch(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, c.ExtKeyUsage)
			assert.Equal(t, []string{"leaf.test", "*.wild.test"}, c.DNSNames)
			require.Len(t, c.IPAddresses, 2)
			assert.True(t, c.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")))
			assert.True(t, c.IPAddresses[1].Equal(net.ParseIP("::1")))
			assert.Equal(t, testNow.Add(-ClockSkew), c.NotBefore)
			assert.Equal(t, testNow.Add(30*24*time.Hour), c.NotAfter)
			assert.NotZero(t, c.KeyUsage&x509.KeyUsageDigitalSignature)
			_, isRSA := f.leaf.Key.(*rsa.PrivateKey)
			assert.Equal(t, isRSA, c.KeyUsage&x509.KeyUsageKeyEncipherment != 0, "KeyEncipherment iff RSA")
			assert.NotEqual(t, 0, f.ca.Cert.SerialNumber.Cmp(c.SerialNumber))

			roots := x509.NewCertPool()
			roots.AddCert(f.ca.Cert)
			for _, opts := range []x509.VerifyOptions{
				{Roots: roots, CurrentTime: testNow, DNSName: "leaf.test", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
				{Roots: roots, CurrentTime: testNow, DNSName: "x.wild.test"},
				{Roots: roots, CurrentTime: testNow, DNSName: "127.0.0.1"},
				{Roots: roots, CurrentTime: testNow, DNSName: "::1"},
				{Roots: roots, CurrentTime: testNow, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
			} {
				_, err := c.Verify(opts)
				assert.NoError(t, err, "verify %s", opts.DNSName)
			}
			_, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: testNow, DNSName: "other.test"})
			assert.Error(t, err)

			kp, err := ParseCertKey(f.leaf.CertPEM, f.leaf.KeyPEM, testNow)
			require.NoError(t, err)
			assert.Equal(t, c.Raw, kp.Leaf.Raw)
		})
	}
}

// TestIssueLeafWithGivenKey: Request.Key is used as the leaf's key (and
// KeyType ignored), so many leaves can share one.
func TestIssueLeafWithGivenKey(t *testing.T) {
	ca, err := NewCA(Request{CommonName: "ca", Now: testNow, Lifetime: time.Hour})
	require.NoError(t, err)
	key, err := GenerateKey(ECDSAP256)
	require.NoError(t, err)
	var serials []string
	for _, name := range []string{"a.test", "b.test"} {
		leaf, err := IssueLeaf(ca, Request{CommonName: name, Now: testNow, Lifetime: time.Hour, Key: key, KeyType: RSA2048})
		require.NoError(t, err)
		assert.Same(t, key, leaf.Key)
		assert.True(t, key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(leaf.Cert.PublicKey), name)
		_, err = ParseCertKey(leaf.CertPEM, leaf.KeyPEM, testNow)
		require.NoError(t, err, name)
		serials = append(serials, leaf.Cert.SerialNumber.String())
	}
	assert.NotEqual(t, serials[0], serials[1])
}

func TestIssueLeafValidityCappedByCA(t *testing.T) {
	ca, err := NewCA(Request{CommonName: "short-ca", Now: testNow, Lifetime: time.Hour})
	require.NoError(t, err)

	long, err := IssueLeaf(ca, Request{CommonName: "long", Now: testNow, Lifetime: 10 * time.Hour})
	require.NoError(t, err)
	assert.Equal(t, ca.Cert.NotAfter, long.Cert.NotAfter, "NotAfter capped at the CA's")

	early, err := IssueLeaf(ca, Request{CommonName: "early", Now: testNow.Add(-10 * time.Minute), Lifetime: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, ca.Cert.NotBefore, early.Cert.NotBefore, "NotBefore not before the CA's")
	assert.Equal(t, testNow.Add(50*time.Minute), early.Cert.NotAfter)

	// A capped leaf that would never be valid is an error, not a
	// certificate whose NotAfter precedes its NotBefore.
	_, err = IssueLeaf(ca, Request{CommonName: "after-ca", Now: testNow.Add(2 * time.Hour), Lifetime: time.Hour})
	assert.ErrorContains(t, err, "short-ca")
	_, err = IssueLeaf(ca, Request{CommonName: "before-ca", Now: testNow.Add(-3 * time.Hour), Lifetime: time.Hour})
	assert.ErrorContains(t, err, "short-ca")
	edge, err := IssueLeaf(ca, Request{CommonName: "edge", Now: ca.Cert.NotAfter.Add(-time.Minute), Lifetime: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, ca.Cert.NotAfter, edge.Cert.NotAfter)

	for _, leaf := range []*Issued{long, early, edge} {
		assert.False(t, leaf.Cert.NotBefore.Before(ca.Cert.NotBefore))
		assert.False(t, leaf.Cert.NotAfter.After(ca.Cert.NotAfter))
		assert.True(t, leaf.Cert.NotAfter.After(leaf.Cert.NotBefore))
		assert.NoError(t, leaf.Cert.CheckSignatureFrom(ca.Cert))
	}
}

func TestIssueLeafErrors(t *testing.T) {
	f := fixtureFor(t, ECDSAP256)
	r := Request{CommonName: "x", Now: testNow, Lifetime: time.Hour}
	_, err := IssueLeaf(nil, r)
	assert.Error(t, err)
	_, err = IssueLeaf(&Issued{Cert: f.ca.Cert}, r)
	assert.Error(t, err)
	_, err = IssueLeaf(&Issued{Key: f.ca.Key}, r)
	assert.Error(t, err)
	_, err = IssueLeaf(f.ca, Request{CommonName: "x", Now: testNow})
	assert.Error(t, err)
	_, err = IssueLeaf(f.ca, Request{CommonName: "x", Lifetime: time.Hour})
	assert.Error(t, err)
	_, err = IssueLeaf(f.ca, Request{CommonName: "x", Now: testNow, Lifetime: time.Hour, KeyType: "bogus"})
	assert.Error(t, err)
}

func TestParseCertKey(t *testing.T) {
	p256 := fixtureFor(t, ECDSAP256)
	for _, tc := range parseCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			certIn, keyIn := bytes.Clone(tc.cert), bytes.Clone(tc.key)
			kp, err := ParseCertKey(tc.cert, tc.key, tc.now)
			assert.Equal(t, certIn, tc.cert, "input modified")
			assert.Equal(t, keyIn, tc.key, "input modified")
			if tc.want != nil {
				require.Error(t, err)
				assert.Nil(t, kp)
				assert.ErrorIs(t, err, tc.want)
				for _, other := range sentinels {
					if other != tc.want {
						assert.NotErrorIs(t, err, other)
					}
				}
				// The keys of every fixture, whichever this case used.
				assertNoKeyMaterial(t, err, tc.key, p256.leaf.KeyPEM, fixtureFor(t, RSA2048).leaf.KeyPEM)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, kp.Leaf)
			assert.Same(t, kp.Leaf, kp.TLS.Leaf)
			require.NotEmpty(t, kp.TLS.Certificate)
			assert.Equal(t, kp.TLS.Certificate[0], kp.Leaf.Raw)
			signer, ok := kp.TLS.PrivateKey.(crypto.Signer)
			require.True(t, ok)
			assert.True(t, signer.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(kp.Leaf.PublicKey))
		})
	}
}

func TestParseCertKeyChain(t *testing.T) {
	chain, err := chainFixture()
	require.NoError(t, err)
	kp, err := ParseCertKey(chain.leaf.CertPEM, chain.leaf.KeyPEM, testNow)
	require.NoError(t, err)
	require.Len(t, kp.TLS.Certificate, 2)
	assert.Equal(t, "chained.test", kp.Leaf.Subject.CommonName)
	inter, err := x509.ParseCertificate(kp.TLS.Certificate[1])
	require.NoError(t, err)
	assert.Equal(t, "chain-intermediate", inter.Subject.CommonName)

	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(chain.ca.Cert)
	inters.AddCert(inter)
	_, err = kp.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, CurrentTime: testNow, DNSName: "chained.test"})
	assert.NoError(t, err)

	// Out of order: the error says which certificate is wrong and why.
	leafPEM := EncodeCertPEM(chain.leaf.Cert.Raw)
	_, err = ParseCertKey(join(leafPEM, chain.ca.CertPEM, chain.leaf.CertPEM[len(leafPEM):]), chain.leaf.KeyPEM, testNow)
	require.ErrorIs(t, err, ErrBrokenChain)
	assert.ErrorContains(t, err, `certificate 1 (subject "chained.test") was issued by "chain-intermediate", but certificate 2 is "chain-root"`)
}

func TestCheckValidity(t *testing.T) {
	c := fixtureFor(t, ECDSAP256).leaf.Cert
	assert.NoError(t, CheckValidity(c, time.Time{}))
	assert.NoError(t, CheckValidity(c, testNow))
	assert.NoError(t, CheckValidity(c, c.NotBefore))
	assert.NoError(t, CheckValidity(c, c.NotAfter))
	err := CheckValidity(c, c.NotAfter.Add(time.Nanosecond))
	assert.ErrorIs(t, err, ErrExpired)
	assert.ErrorContains(t, err, "leaf.test")
	err = CheckValidity(c, c.NotBefore.Add(-time.Nanosecond))
	assert.ErrorIs(t, err, ErrNotYetValid)
	assert.ErrorContains(t, err, "leaf.test")
}

func TestParseCABundle(t *testing.T) {
	p256 := fixtureFor(t, ECDSAP256)
	rsaF := fixtureFor(t, RSA2048)
	expired, err := NewCA(Request{CommonName: "expired-ca", Now: testNow.Add(-48 * time.Hour), Lifetime: time.Hour})
	require.NoError(t, err)

	t.Run("several with text between", func(t *testing.T) {
		bundle := join(
			[]byte("# evercert CA bundle\n"), p256.ca.CertPEM,
			[]byte("subject=/CN=rsa\n"), rsaF.ca.CertPEM,
			expired.CertPEM, []byte("\n"),
		)
		certs, err := ParseCABundle(bundle)
		require.NoError(t, err)
		require.Len(t, certs, 3)
		assert.Equal(t, p256.ca.Cert.Raw, certs[0].Raw)
		assert.Equal(t, rsaF.ca.Cert.Raw, certs[1].Raw)
		assert.Equal(t, expired.Cert.Raw, certs[2].Raw, "expired CA kept")

		pool, poolCerts, err := NewPool(bundle)
		require.NoError(t, err)
		require.NotNil(t, pool)
		assert.Len(t, poolCerts, 3)
		for _, leaf := range []*Issued{p256.leaf, rsaF.leaf} {
			_, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: testNow, DNSName: "leaf.test"})
			assert.NoError(t, err)
		}
		other, err := NewCA(Request{CommonName: "other", Now: testNow, Lifetime: time.Hour})
		require.NoError(t, err)
		stranger, err := IssueLeaf(other, Request{CommonName: "s", DNSNames: []string{"leaf.test"}, Now: testNow, Lifetime: time.Hour})
		require.NoError(t, err)
		_, err = stranger.Cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: testNow, DNSName: "leaf.test"})
		assert.Error(t, err, "a CA outside the bundle must not verify")
	})

	t.Run("single", func(t *testing.T) {
		certs, err := ParseCABundle(p256.ca.CertPEM)
		require.NoError(t, err)
		require.Len(t, certs, 1)
	})

	for name, tc := range map[string]struct {
		bundle   []byte
		want     error
		contains string
	}{
		"nil":                     {nil, ErrEmpty, "CA bundle"},
		"white space":             {[]byte("\n \t\n"), ErrEmpty, "CA bundle"},
		"too large":               {join(p256.ca.CertPEM, bytes.Repeat([]byte("\n"), MaxPEMSize)), ErrTooLarge, "CA bundle"},
		"garbage":                 {[]byte("garbage"), ErrMalformedPEM, "no PEM block"},
		"trailing garbage":        {join(p256.ca.CertPEM, []byte("garbage")), ErrMalformedPEM, "trailing data"},
		"key block":               {join(p256.ca.CertPEM, p256.ca.KeyPEM), ErrMalformedPEM, "want CERTIFICATE"},
		"bad DER second":          {join(p256.ca.CertPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")})), ErrMalformedPEM, "certificate 2"},
		"truncated":               {p256.ca.CertPEM[:len(p256.ca.CertPEM)-20], ErrMalformedPEM, "CA bundle"},
		"encrypted key is no CA ": {pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}), ErrMalformedPEM, "want CERTIFICATE"},
	} {
		t.Run(name, func(t *testing.T) {
			certs, err := ParseCABundle(tc.bundle)
			require.Error(t, err)
			assert.Nil(t, certs)
			assert.ErrorIs(t, err, tc.want)
			assert.ErrorContains(t, err, tc.contains)
			assertNoKeyMaterial(t, err, p256.ca.KeyPEM)
			pool, certs, err := NewPool(tc.bundle)
			assert.ErrorIs(t, err, tc.want)
			assert.Nil(t, pool)
			assert.Nil(t, certs)
		})
	}
}

// TestSentinelsDistinct guards the errors.Is contract: no sentinel wraps
// another.
func TestSentinelsDistinct(t *testing.T) {
	for i, a := range sentinels {
		assert.NotEmpty(t, a.Error())
		for j, b := range sentinels {
			if i != j {
				assert.False(t, errors.Is(a, b), "%v is %v", a, b)
			}
		}
	}
}

func TestRequestBackdate(t *testing.T) {
	now := time.Now()
	ca, err := NewCA(Request{CommonName: "skew-ca", Now: now, Lifetime: 24 * time.Hour, Backdate: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Cert.NotBefore.Equal(now.Add(-time.Hour).Truncate(time.Second)) && !ca.Cert.NotBefore.Before(now.Add(-59*time.Minute)) {
		t.Fatalf("NotBefore %v, want an hour before %v", ca.Cert.NotBefore, now)
	}
	leaf, err := IssueLeaf(ca, Request{CommonName: "l", Now: now, Lifetime: time.Hour, Backdate: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Cert.NotBefore.Before(ca.Cert.NotBefore) {
		t.Fatalf("leaf NotBefore %v before its CA's %v", leaf.Cert.NotBefore, ca.Cert.NotBefore)
	}
	if _, err := NewCA(Request{CommonName: "neg", Now: now, Lifetime: time.Hour, Backdate: -time.Second}); err == nil {
		t.Fatal("a negative backdate was accepted")
	}
}
