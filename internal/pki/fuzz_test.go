package pki

import (
	"bytes"
	"crypto"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
)

// FuzzParseCertKey feeds arbitrary certificate and key PEM to ParseCertKey at
// the fixed testNow. Seeds: a valid pair of every key type and every bad
// case of TestParseCertKey (except the oversized ones).
//
// Properties: it never panics and never modifies its input; a success is a
// usable serving pair (TLS.Leaf set, the leaf's public key matches the
// private key, valid at testNow, server auth allowed); a failure wraps one
// of the package's sentinels and its message holds no PEM armor.
func FuzzParseCertKey(f *testing.F) {
	for _, tc := range parseCases(f) {
		if !tc.large {
			f.Add(tc.cert, tc.key)
		}
	}
	f.Fuzz(func(t *testing.T, certPEM, keyPEM []byte) {
		certIn, keyIn := bytes.Clone(certPEM), bytes.Clone(keyPEM)
		kp, err := ParseCertKey(certPEM, keyPEM, testNow)
		if !bytes.Equal(certIn, certPEM) || !bytes.Equal(keyIn, keyPEM) {
			t.Fatal("ParseCertKey modified its input")
		}
		if err != nil {
			if kp != nil {
				t.Fatalf("ParseCertKey returned a pair and an error: %v", err)
			}
			checkFuzzError(t, err)
			return
		}
		if kp == nil || kp.Leaf == nil || kp.TLS.Leaf != kp.Leaf {
			t.Fatalf("ParseCertKey succeeded without a leaf: %+v", kp)
		}
		if len(kp.TLS.Certificate) == 0 || !bytes.Equal(kp.TLS.Certificate[0], kp.Leaf.Raw) {
			t.Fatal("TLS.Certificate[0] is not the leaf")
		}
		signer, ok := kp.TLS.PrivateKey.(crypto.Signer)
		if !ok {
			t.Fatalf("private key %T is not a crypto.Signer", kp.TLS.PrivateKey)
		}
		pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
		if !ok || !pub.Equal(kp.Leaf.PublicKey) {
			t.Fatal("the leaf's public key does not match the private key")
		}
		if err := CheckValidity(kp.Leaf, testNow); err != nil {
			t.Fatalf("accepted a leaf that is not valid now: %v", err)
		}
		if len(bytes.TrimSpace(certPEM)) == 0 || len(certPEM) > MaxPEMSize || len(keyPEM) > MaxPEMSize {
			t.Fatal("accepted empty or oversized input")
		}
		if rest := lastBlockRest(certPEM); len(bytes.TrimSpace(rest)) != 0 {
			t.Fatalf("accepted %d bytes of trailing data in the certificate", len(rest))
		}
		if rest := lastBlockRest(keyPEM); len(bytes.TrimSpace(rest)) != 0 {
			t.Fatalf("accepted %d bytes of trailing data in the key", len(rest))
		}
	})
}

// FuzzParseCABundle feeds arbitrary bytes to ParseCABundle and NewPool.
//
// Properties: no panic; the two agree; a success returns one certificate per
// PEM block, in order; a failure wraps a sentinel and holds no PEM armor.
func FuzzParseCABundle(f *testing.F) {
	all, err := fixtures()
	if err != nil {
		f.Fatal(err)
	}
	var every [][]byte
	for _, kt := range KeyTypes {
		fx := all[kt]
		f.Add(fx.ca.CertPEM)
		every = append(every, fx.ca.CertPEM)
	}
	expired, err := NewCA(Request{CommonName: "expired-ca", Now: testNow.AddDate(-1, 0, 0), Lifetime: 1})
	if err != nil {
		f.Fatal(err)
	}
	p256 := all[ECDSAP256]
	f.Add(bytes.Join(every, []byte("\n# between\n")))
	f.Add(append(bytes.Clone(p256.ca.CertPEM), expired.CertPEM...))
	f.Add([]byte(nil))
	f.Add([]byte(" \n\t"))
	f.Add([]byte("garbage"))
	f.Add(append(bytes.Clone(p256.ca.CertPEM), "garbage"...))
	f.Add(append(bytes.Clone(p256.ca.CertPEM), p256.ca.KeyPEM...))
	f.Add(p256.ca.CertPEM[:len(p256.ca.CertPEM)/2])
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")}))
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: p256.ca.Cert.Raw}))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n"))

	f.Fuzz(func(t *testing.T, bundle []byte) {
		in := bytes.Clone(bundle)
		certs, err := ParseCABundle(bundle)
		if !bytes.Equal(in, bundle) {
			t.Fatal("ParseCABundle modified its input")
		}
		pool, poolCerts, poolErr := NewPool(bundle)
		if (err == nil) != (poolErr == nil) || len(certs) != len(poolCerts) {
			t.Fatalf("ParseCABundle (%d, %v) and NewPool (%d, %v) disagree", len(certs), err, len(poolCerts), poolErr)
		}
		if err != nil {
			if certs != nil || pool != nil {
				t.Fatalf("returned results and an error: %v", err)
			}
			checkFuzzError(t, err)
			return
		}
		if pool == nil || len(certs) == 0 {
			t.Fatal("success without certificates")
		}
		i := 0
		for rest := bundle; ; i++ {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				if len(bytes.TrimSpace(rest)) != 0 {
					t.Fatalf("accepted %d bytes of trailing data", len(rest))
				}
				break
			}
			if block.Type != "CERTIFICATE" {
				t.Fatalf("accepted a %q block", block.Type)
			}
			if i >= len(certs) || !bytes.Equal(certs[i].Raw, block.Bytes) {
				t.Fatalf("certificate %d does not match PEM block %d", i, i)
			}
		}
		if i != len(certs) {
			t.Fatalf("%d certificates from %d PEM blocks", len(certs), i)
		}
	})
}

// checkFuzzError is the failure property shared by the fuzz targets.
func checkFuzzError(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if msg == "" {
		t.Fatal("empty error message")
	}
	if strings.Contains(msg, "-----BEGIN") || strings.Contains(msg, "-----END") {
		t.Fatalf("error message contains PEM armor: %q", msg)
	}
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return
		}
	}
	t.Fatalf("error wraps no sentinel: %v", err)
}

// lastBlockRest returns what follows the last PEM block of data.
func lastBlockRest(data []byte) []byte {
	rest := data
	for {
		block, r := pem.Decode(rest)
		if block == nil {
			return rest
		}
		rest = r
	}
}

// FuzzSplitCertKey feeds arbitrary bytes to SplitCertKey, the reader of a
// file holding a key and its chain (the kubelet's podCertificate credential
// bundle). Seeds: every case of TestSplitCertKey except the oversized one.
//
// Properties: no panic, input not modified; a success returns only
// CERTIFICATE blocks (as many as the input holds, in order) and the key
// blocks, exactly one of them a private key, with nothing around them; a
// failure wraps a sentinel and holds no PEM armor.
func FuzzSplitCertKey(f *testing.F) {
	for _, tc := range splitCases(f) {
		if !errors.Is(tc.want, ErrTooLarge) {
			f.Add(tc.in)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := bytes.Clone(data)
		certPEM, keyPEM, err := SplitCertKey(data)
		if !bytes.Equal(in, data) {
			t.Fatal("SplitCertKey modified its input")
		}
		if err != nil {
			if certPEM != nil || keyPEM != nil {
				t.Fatalf("returned content and an error: %v", err)
			}
			checkFuzzError(t, err)
			return
		}
		var inCerts [][]byte
		for rest := data; ; {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				break
			}
			if block.Type == "CERTIFICATE" {
				inCerts = append(inCerts, block.Bytes)
			}
		}
		i := 0
		for rest := certPEM; ; i++ {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				if len(rest) != 0 {
					t.Fatalf("%d bytes after the certificates", len(rest))
				}
				break
			}
			if block.Type != "CERTIFICATE" || i >= len(inCerts) || !bytes.Equal(block.Bytes, inCerts[i]) {
				t.Fatalf("certificate %d is not the input's certificate %d", i, i)
			}
		}
		if i == 0 || i != len(inCerts) {
			t.Fatalf("%d certificates returned of %d", i, len(inCerts))
		}
		keys := 0
		for rest := keyPEM; ; {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				if len(rest) != 0 {
					t.Fatalf("%d bytes after the key", len(rest))
				}
				break
			}
			if block.Type == "CERTIFICATE" {
				t.Fatal("a certificate in the key PEM")
			}
			if strings.HasSuffix(block.Type, "PRIVATE KEY") {
				keys++
			}
		}
		if keys != 1 {
			t.Fatalf("%d private keys returned, want 1", keys)
		}
	})
}
