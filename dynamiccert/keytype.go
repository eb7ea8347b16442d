package dynamiccert

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// KeyType selects the algorithm and size of a key the issuers (SelfSigned,
// Authority) and the loopback certificate generate. Every KeyType is
// approved in FIPS 140-3 mode.
type KeyType string

// The supported key types. Their names are those of --self-signed-key-types.
const (
	// ECDSAP256 is an ECDSA key on NIST P-256: the default. It is cheap to
	// generate, and a handshake signed with it costs the server about half
	// of an RSA-2048 one.
	ECDSAP256 KeyType = "ecdsa-p256"
	// ECDSAP384 is an ECDSA key on NIST P-384.
	ECDSAP384 KeyType = "ecdsa-p384"
	// RSA2048 is a 2048-bit RSA key, for clients that cannot use ECDSA, and
	// the type upstream k8s.io/apiserver generates.
	RSA2048 KeyType = "rsa-2048"
	// RSA3072 is a 3072-bit RSA key.
	RSA3072 KeyType = "rsa-3072"
)

// KeyTypes lists every supported KeyType, the default first. Callers must
// not modify it.
var KeyTypes = []KeyType{ECDSAP256, ECDSAP384, RSA2048, RSA3072}

// ParseKeyType returns the KeyType named s, ignoring case; an unknown or
// empty name is an error that lists the supported ones.
func ParseKeyType(s string) (KeyType, error) {
	for _, kt := range KeyTypes {
		if strings.EqualFold(s, string(kt)) {
			return kt, nil
		}
	}
	return "", fmt.Errorf("unknown key type %q (want one of %s)", s, joinKeyTypes(KeyTypes))
}

// ParseKeyTypes parses a list of key type names (ParseKeyType), as
// --self-signed-key-types takes it. It refuses an empty list and a type
// named twice.
func ParseKeyTypes(names []string) ([]KeyType, error) {
	if len(names) == 0 {
		return nil, errors.New("at least one key type is required")
	}
	out := make([]KeyType, 0, len(names))
	for _, name := range names {
		kt, err := ParseKeyType(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, kt) {
			return nil, fmt.Errorf("key type %q is listed twice", kt)
		}
		out = append(out, kt)
	}
	return out, nil
}

func joinKeyTypes(kts []KeyType) string {
	names := make([]string, len(kts))
	for i, kt := range kts {
		names[i] = string(kt)
	}
	return strings.Join(names, ", ")
}
