package authority

import (
	"github.com/evercert/evercert/dynamiccert"
)

// completeKeyTypes returns the default ([dynamiccert.ECDSAP256]) for an empty list and
// checks a given one with dynamiccert.ParseKeyTypes, returning a copy the caller owns.
func completeKeyTypes(kts []dynamiccert.KeyType) ([]dynamiccert.KeyType, error) {
	if len(kts) == 0 {
		return []dynamiccert.KeyType{dynamiccert.ECDSAP256}, nil
	}
	names := make([]string, len(kts))
	for i, kt := range kts {
		names[i] = string(kt)
	}
	return dynamiccert.ParseKeyTypes(names)
}

// caKeyType is the key type of the CA that signs leaves of every type in
// kts: the first RSA type when there is one, so that a client that can
// only verify RSA signatures (the reason to serve an RSA leaf) can verify
// the chain of every leaf; otherwise the first type.
func caKeyType(kts []dynamiccert.KeyType) dynamiccert.KeyType {
	for _, kt := range kts {
		if kt == dynamiccert.RSA2048 || kt == dynamiccert.RSA3072 {
			return kt
		}
	}
	return kts[0]
}
