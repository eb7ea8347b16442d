package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// ClockSkew is how far NotBefore is backdated on every issued certificate, so
// that a peer whose clock is a little behind still accepts it.
const ClockSkew = 5 * time.Minute

// Issued is a certificate together with its private key, in both parsed and
// PEM forms. It is immutable once returned.
type Issued struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
	// KeyRef, when set, names Key in an external key store (an HSM): the
	// key cannot be exported and KeyPEM is empty.
	KeyRef string
}

// KeyPair returns the certificate and key ready to serve, as ParseCertKey
// would return them for CertPEM and KeyPEM, without parsing anything: the
// chain is the certificate alone.
func (i *Issued) KeyPair() *KeyPair {
	return &KeyPair{
		TLS:  tls.Certificate{Certificate: [][]byte{i.Cert.Raw}, PrivateKey: i.Key, Leaf: i.Cert},
		Leaf: i.Cert,
	}
}

// Request describes a certificate to issue.
type Request struct {
	// CommonName is the subject CN.
	CommonName string
	// DNSNames and IPs become subject alternative names (leaf only).
	DNSNames []string
	IPs      []net.IP
	// KeyType selects the key algorithm; zero means ECDSAP256.
	KeyType KeyType
	// Key, when set, is the leaf's key instead of a newly generated one, and
	// KeyType is ignored. Benchmarks that need many certificates share one
	// key: generating a key costs more than signing. For NewCA it is a key
	// held in an external key store (an HSM): it is not PEM encoded, and
	// KeyRef is copied to the result.
	Key crypto.Signer
	// KeyRef names Key in its key store (NewCA only).
	KeyRef string
	// Now is the issuance time; NotBefore is Now-Backdate.
	Now time.Time
	// Backdate is how far NotBefore lies before Now, so that peers whose
	// clocks are behind by up to that much accept the certificate. Zero
	// means ClockSkew; it must not be negative.
	Backdate time.Duration
	// Lifetime is NotAfter-Now. It must be positive.
	Lifetime time.Duration
}

func (r Request) validity() (time.Time, time.Time, error) {
	if r.Lifetime <= 0 {
		return time.Time{}, time.Time{}, fmt.Errorf("certificate lifetime must be positive, got %v", r.Lifetime)
	}
	if r.Now.IsZero() {
		return time.Time{}, time.Time{}, errors.New("issuance time is not set")
	}
	backdate := r.Backdate
	if backdate < 0 {
		return time.Time{}, time.Time{}, fmt.Errorf("backdate must not be negative, got %v", backdate)
	}
	if backdate == 0 {
		backdate = ClockSkew
	}
	return r.Now.Add(-backdate), r.Now.Add(r.Lifetime), nil
}

// NewSerial returns a random, positive 128-bit serial number.
func NewSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	// Zero is not a valid serial; a collision chance of 2^-128 is fine, a
	// zero is not.
	return serial.Add(serial, big.NewInt(1)), nil
}

// NewCA issues a self-signed CA certificate that can sign leaves only
// (MaxPathLen 0).
func NewCA(r Request) (*Issued, error) {
	notBefore, notAfter, err := r.validity()
	if err != nil {
		return nil, err
	}
	key, external := r.Key, r.Key != nil
	if !external {
		if key, err = GenerateKey(r.KeyType); err != nil {
			return nil, err
		}
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: r.CommonName},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	ca, err := sign(tmpl, tmpl, key, key, !external)
	if err != nil {
		return nil, err
	}
	ca.KeyRef = r.KeyRef
	return ca, nil
}

// IssueLeaf issues a server (and client) leaf certificate signed by ca. The
// leaf never outlives its CA: NotAfter is capped at the CA's NotAfter.
func IssueLeaf(ca *Issued, r Request) (*Issued, error) {
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return nil, errors.New("issuing leaf: no CA")
	}
	notBefore, notAfter, err := r.validity()
	if err != nil {
		return nil, err
	}
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	if notBefore.Before(ca.Cert.NotBefore) {
		notBefore = ca.Cert.NotBefore
	}
	if !notAfter.After(notBefore) {
		// The CA has expired by r.Now, or becomes valid only after the
		// requested lifetime: the capped leaf would never be valid.
		return nil, fmt.Errorf("issuing leaf %q: CA %q (valid %s to %s) does not cover any of the requested validity from %s",
			r.CommonName, ca.Cert.Subject.CommonName, ca.Cert.NotBefore.UTC().Format(time.RFC3339),
			ca.Cert.NotAfter.UTC().Format(time.RFC3339), r.Now.UTC().Format(time.RFC3339))
	}
	key := r.Key
	if key == nil {
		if key, err = GenerateKey(r.KeyType); err != nil {
			return nil, err
		}
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, err
	}
	tmpl := leafTemplate(serial, r.CommonName, r.DNSNames, r.IPs, notBefore, notAfter, key.Public())
	return sign(tmpl, ca.Cert, key, ca.Key, true)
}

// leafTemplate is the template of every leaf evercert signs: a server and
// client certificate for the names, that cannot sign certificates.
func leafTemplate(serial *big.Int, commonName string, dnsNames []string, ips []net.IP, notBefore, notAfter time.Time, pub crypto.PublicKey) *x509.Certificate {
	keyUsage := x509.KeyUsageDigitalSignature
	if _, isRSA := pub.(*rsa.PublicKey); isRSA {
		// RSA key exchange in TLS 1.2 needs KeyEncipherment; harmless otherwise.
		keyUsage |= x509.KeyUsageKeyEncipherment
	}
	return &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		DNSNames:              dnsNames,
		IPAddresses:           ips,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              keyUsage,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
}

// sign signs tmpl for key with parentKey; encodeKey says whether key is
// PEM encoded (an external key cannot be).
func sign(tmpl, parent *x509.Certificate, key, parentKey crypto.Signer, encodeKey bool) (*Issued, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, fmt.Errorf("signing certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing issued certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	var keyPEM []byte
	if encodeKey {
		if keyPEM, err = EncodeKeyPEM(key); err != nil {
			return nil, err
		}
	}
	return &Issued{Cert: cert, Key: key, CertPEM: EncodeCertPEM(der), KeyPEM: keyPEM}, nil
}
