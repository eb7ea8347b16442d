package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
)

// KeyType selects the algorithm and size of a generated private key.
type KeyType string

const (
	// ECDSAP256 is an ECDSA key on NIST P-256. It is the default: it is fast
	// to generate and to handshake with, and every TLS client supports it.
	ECDSAP256 KeyType = "ecdsa-p256"
	// ECDSAP384 is an ECDSA key on NIST P-384.
	ECDSAP384 KeyType = "ecdsa-p384"
	// RSA2048 is a 2048-bit RSA key, the type upstream k8s.io/apiserver uses
	// for its self-signed and loopback certificates.
	RSA2048 KeyType = "rsa-2048"
	// RSA3072 is a 3072-bit RSA key.
	RSA3072 KeyType = "rsa-3072"
)

// KeyTypes lists every supported KeyType, default first. Names are parsed
// by dynamiccert.ParseKeyType, the public vocabulary.
var KeyTypes = []KeyType{ECDSAP256, ECDSAP384, RSA2048, RSA3072}

// GenerateKey makes a new private key of type kt; the zero KeyType means
// ECDSAP256.
func GenerateKey(kt KeyType) (crypto.Signer, error) {
	switch kt {
	case ECDSAP256, "":
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case ECDSAP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case RSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case RSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	default:
		return nil, fmt.Errorf("unknown key type %q", kt)
	}
}

// EncodeKeyPEM encodes key as a PKCS#8 "PRIVATE KEY" PEM block.
func EncodeKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshaling private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// EncodeCertPEM encodes a DER certificate as a "CERTIFICATE" PEM block.
func EncodeCertPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
