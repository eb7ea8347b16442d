package attest

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"
	"oras.land/oras-go/v2/registry"
)

// LoadSigner returns the signer of the PEM private key file at path: an
// unencrypted ECDSA P-256 key (PKCS#8 "PRIVATE KEY" or SEC 1 "EC PRIVATE
// KEY"), what cosign generate-key-pair and openssl ecparam make, signing
// SHA-256 digests. Another key type or curve is refused, so that what
// verifies here verifies with cosign's defaults too. Errors name the file,
// never the key.
func LoadSigner(path string) (signature.Signer, error) {
	pemBytes, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	priv, err := cryptoutils.UnmarshalPEMToPrivateKey(pemBytes, cryptoutils.SkipPassword)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	ec, ok := priv.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("signing key %s: a %T, want an ECDSA P-256 key", path, priv)
	}
	return signature.LoadECDSASigner(ec, crypto.SHA256)
}

// LoadVerifier returns the verifier of the PEM public key file at path
// (PKIX "PUBLIC KEY", what cosign generate-key-pair writes as cosign.pub).
func LoadVerifier(path string) (signature.Verifier, error) {
	v, err := signature.LoadVerifierFromPEMFile(path, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("public key %s: %w", path, err)
	}
	return v, nil
}

// sign writes into store a signature of subject by signer: cosign's simple
// signing payload naming identity and subject's digest, as the layer of a
// signature manifest whose subject is subject, the signature in the layer's
// annotation (as cosign lays it out), the manifest annotated with
// manifestAnnotations.
func sign(ctx context.Context, store *oci.Store, subject ocispec.Descriptor, identity string, signer signature.Signer, manifestAnnotations map[string]string) (ocispec.Descriptor, error) {
	ref, err := name.NewDigest(identity + "@" + subject.Digest.String())
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("identity %q: %w", identity, err)
	}
	p, err := json.Marshal(payload.Cosign{Image: ref, ClaimedIdentity: identity})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	sig, err := signer.SignMessage(bytes.NewReader(p))
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return pushArtifact(ctx, store, subject, SignatureArtifactType, SimpleSigningMediaType, p,
		map[string]string{SignatureAnnotation: base64.StdEncoding.EncodeToString(sig)}, manifestAnnotations)
}

// verifySignature returns nil if one of the signature referrers of subject
// in store is valid for verifier and its payload names subject's digest,
// else an error saying why each failed.
func verifySignature(ctx context.Context, store content.ReadOnlyGraphStorage, subject ocispec.Descriptor, verifier signature.Verifier) error {
	sigs, err := registry.Referrers(ctx, store, subject, SignatureArtifactType)
	if err != nil {
		return fmt.Errorf("signatures: %w", err)
	}
	if len(sigs) == 0 {
		return errors.New("not signed: no signature referrer")
	}
	var errs []error
	for _, s := range sigs {
		if err := verifyOne(ctx, store, s, subject, verifier); err != nil {
			errs = append(errs, fmt.Errorf("signature %s: %w", s.Digest, err))
			continue
		}
		return nil
	}
	return fmt.Errorf("no signature verifies with the public key: %w", errors.Join(errs...))
}

// verifyOne checks the signature manifest sig of subject.
func verifyOne(ctx context.Context, store content.Fetcher, sig, subject ocispec.Descriptor, verifier signature.Verifier) error {
	m, err := manifestOf(ctx, store, sig)
	if err != nil {
		return err
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != SimpleSigningMediaType {
		return fmt.Errorf("want one layer of %s", SimpleSigningMediaType)
	}
	p, err := content.FetchAll(ctx, store, m.Layers[0])
	if err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	sigBytes, err := base64.StdEncoding.DecodeString(m.Layers[0].Annotations[SignatureAnnotation])
	if err != nil || len(sigBytes) == 0 {
		return fmt.Errorf("no signature in annotation %s", SignatureAnnotation)
	}
	if err := verifier.VerifySignature(bytes.NewReader(sigBytes), bytes.NewReader(p)); err != nil {
		return fmt.Errorf("invalid for the public key: %w", err)
	}
	// Only a payload the key signed is read: it must name this subject.
	var simple payload.SimpleContainerImage
	if err := json.Unmarshal(p, &simple); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	if simple.Critical.Type != payload.CosignSignatureType {
		return fmt.Errorf("payload type %q, want %q", simple.Critical.Type, payload.CosignSignatureType)
	}
	if got := simple.Critical.Image.DockerManifestDigest; got != subject.Digest.String() {
		return fmt.Errorf("signs %s, not %s", got, subject.Digest)
	}
	return nil
}
