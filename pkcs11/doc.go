// Package pkcs11 keeps an evercert Authority's CA private keys in a PKCS#11
// token (an HSM, a cloud HSM's PKCS#11 library, or SoftHSM2) instead of its
// CA Secret: KeySource implements authority.CAKeySource. The Secret then
// holds the CA certificates and each key's label (the reference), never a
// private key; every replica opens the same token and finds the key by its
// label. See docs/architecture.md.
//
// It is built on github.com/ThalesGroup/crypto11, not on
// github.com/miekg/pkcs11 directly. crypto11 wraps miekg/pkcs11 and already
// does what a CA key source needs and is easy to get wrong by hand: token
// selection by label or slot, a login that survives in a long-term session,
// a session pool safe for concurrent signatures, ECDSA and RSA key pair
// generation with CKA_SENSITIVE and not CKA_EXTRACTABLE, and crypto.Signer
// keys that encode ECDSA signatures as crypto/x509 expects. Using miekg
// directly would mean re-writing all of it for no gain.
//
// PKCS#11 needs cgo, so this package is its own Go module
// (github.com/evercert/evercert/pkcs11) and the library stays pure Go.
//
// FIPS: with the key in a module, the CA signatures are made by the module,
// so what counts for them is the module's own validation (its FIPS 140
// certificate and its approved mode), not Go's FIPS 140-3 module; GODEBUG
// fips140=only does not cover them. The leaf keys are still made and used
// by Go, and evercert's fips140=only checks of key types and certificates
// (P-256/P-384, RSA of 2048 bits or more) still apply to every CA and leaf
// certificate, whose public keys the module made.
package pkcs11
