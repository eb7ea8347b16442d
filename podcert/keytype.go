package podcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"fmt"
	"slices"
)

// Key types, named as the podCertificate projection's keyType names them.
const (
	KeyTypeRSA3072   = "RSA3072"
	KeyTypeRSA4096   = "RSA4096"
	KeyTypeECDSAP256 = "ECDSAP256"
	KeyTypeECDSAP384 = "ECDSAP384"
	KeyTypeECDSAP521 = "ECDSAP521"
	KeyTypeED25519   = "ED25519"
)

// AllKeyTypes are the key types the PodCertificateRequest API accepts.
var AllKeyTypes = []string{KeyTypeRSA3072, KeyTypeRSA4096, KeyTypeECDSAP256, KeyTypeECDSAP384, KeyTypeECDSAP521, KeyTypeED25519}

// DefaultKeyTypes are the key types a Signer issues to by default: those
// every common TLS client verifies a server with. Ed25519 server
// certificates are refused by browsers and many TLS stacks, and P-521 by
// BoringSSL (Chrome, Envoy), so a serving signer denies them unless
// configured otherwise (reason UnsupportedKeyType, naming these).
var DefaultKeyTypes = []string{KeyTypeECDSAP256, KeyTypeECDSAP384, KeyTypeRSA3072, KeyTypeRSA4096}

// keyTypeOf names the type of pub as the API does; unknown keys get a
// descriptive name that matches no key type.
func keyTypeOf(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA%d", k.N.BitLen())
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return KeyTypeECDSAP256
		case elliptic.P384():
			return KeyTypeECDSAP384
		case elliptic.P521():
			return KeyTypeECDSAP521
		}
		return "ECDSA (unknown curve)"
	case ed25519.PublicKey:
		return KeyTypeED25519
	}
	return fmt.Sprintf("%T", pub)
}

func checkKeyTypes(types []string) error {
	for _, kt := range types {
		if !slices.Contains(AllKeyTypes, kt) {
			return fmt.Errorf("unknown key type %q (want some of %v)", kt, AllKeyTypes)
		}
	}
	return nil
}
