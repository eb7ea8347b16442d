package tlstest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Chain is a root CA and an intermediate CA it signed, issuing leaves the
// way public and cluster CAs do: clients trust the root only, and servers
// must send the intermediate with the leaf. It does not use internal/pki,
// whose tests use it, and whose NewCA makes roots that cannot sign CAs.
type Chain struct {
	Root, Intermediate       *x509.Certificate
	RootPEM, IntermediatePEM []byte
	intermediateKey          crypto.Signer
}

// Leaf is a leaf certificate issued by a Chain.
type Leaf struct {
	Cert *x509.Certificate
	// CertPEM is the leaf followed by the intermediate: what a server
	// serves.
	CertPEM []byte
	// KeyPEM is the PKCS#8 private key.
	KeyPEM []byte
}

// NewChain makes a root and an intermediate, both valid from an hour before
// now for a year, named after name.
func NewChain(now time.Time, name string) (*Chain, error) {
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	rootTmpl := caTemplate(name+"-root", now)
	root, rootPEM, err := sign(rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		return nil, err
	}
	interKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	interTmpl := caTemplate(name+"-intermediate", now)
	interTmpl.MaxPathLenZero = true
	inter, interPEM, err := sign(interTmpl, root, interKey.Public(), rootKey)
	if err != nil {
		return nil, err
	}
	return &Chain{Root: root, Intermediate: inter, RootPEM: rootPEM, IntermediatePEM: interPEM, intermediateKey: interKey}, nil
}

// Issue makes a serving leaf for hosts (DNS names or IP addresses), valid
// from five minutes before now for lifetime, signed by the intermediate.
func (c *Chain) Issue(now time.Time, lifetime time.Duration, hosts ...string) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial.Add(serial, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	leaf, leafPEM, err := sign(tmpl, c.Intermediate, key.Public(), c.intermediateKey)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Leaf{
		Cert:    leaf,
		CertPEM: append(leafPEM, c.IntermediatePEM...),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
	}, nil
}

// RootPool returns a pool holding the root only.
func (c *Chain) RootPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(c.Root)
	return pool
}

func caTemplate(cn string, now time.Time) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, parentKey crypto.Signer) (*x509.Certificate, []byte, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
