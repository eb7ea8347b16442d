package attest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	slsa "github.com/in-toto/attestation/go/predicates/provenance/v1"
	intoto "github.com/in-toto/attestation/go/v1"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore/pkg/signature"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"
	"oras.land/oras-go/v2/registry"
)

// Verified is what Verify checked.
type Verified struct {
	// Image is the image's manifest.
	Image ocispec.Descriptor
	// SBOM is the image's SBOM.
	SBOM *cdx.BOM
	// Provenance is the image's provenance statement and Build its SLSA
	// provenance predicate.
	Provenance *intoto.Statement
	Build      *slsa.Provenance
}

// Verify checks the image tagged tag in the OCI layout in dir and what
// Attach attached to it, reading the layout only:
//   - the image: its manifest, config and layers match their digests;
//   - a signature of the image's digest valid for verifier;
//   - exactly one SBOM referrer of the image, signed as the image is,
//     whose main component's SHA-256 is that of the image's binary;
//   - exactly one provenance referrer of the image, signed as the image
//     is, a valid in-toto SLSA v1 statement whose subject is the image's
//     digest.
//
// The error names the first check that failed and the digest of what it
// read.
func Verify(ctx context.Context, dir, tag string, verifier signature.Verifier) (*Verified, error) {
	var v Verified
	fail := func(format string, args ...any) (*Verified, error) {
		return nil, fmt.Errorf("verify %s (%s): "+format, append([]any{dir, tag}, args...)...)
	}
	store, err := oci.NewFromFS(ctx, os.DirFS(dir))
	if err != nil {
		return fail("layout: %w", err)
	}
	if v.Image, err = store.Resolve(ctx, tag); err != nil {
		return fail("image: %w", err)
	}
	bin, err := verifyImage(ctx, store, dir, v.Image)
	if err != nil {
		return fail("image %s: %w", v.Image.Digest, err)
	}
	if err := verifySignature(ctx, store, v.Image, verifier); err != nil {
		return fail("image %s: %w", v.Image.Digest, err)
	}
	binSum := sha256.Sum256(bin)
	binHash := hex.EncodeToString(binSum[:])

	sbomDesc, sbomData, err := onlyReferrer(ctx, store, v.Image, SBOMArtifactType)
	if err != nil {
		return fail("SBOM: %w", err)
	}
	if err := verifySignature(ctx, store, sbomDesc, verifier); err != nil {
		return fail("SBOM %s: %w", sbomDesc.Digest, err)
	}
	if v.SBOM, err = decodeSBOM(sbomData); err != nil {
		return fail("SBOM %s: %w", sbomDesc.Digest, err)
	}
	if got := mainHash(v.SBOM); got != binHash {
		return fail("SBOM %s: describes a binary of SHA-256 %q, the image's is %s", sbomDesc.Digest, got, binHash)
	}

	provDesc, provData, err := onlyReferrer(ctx, store, v.Image, ProvenanceArtifactType)
	if err != nil {
		return fail("provenance: %w", err)
	}
	if err := verifySignature(ctx, store, provDesc, verifier); err != nil {
		return fail("provenance %s: %w", provDesc.Digest, err)
	}
	if v.Provenance, v.Build, err = decodeProvenance(provData); err != nil {
		return fail("provenance %s: %w", provDesc.Digest, err)
	}
	if !hasSubject(v.Provenance, v.Image) {
		return fail("provenance %s: its subject %v is not the image %s", provDesc.Digest, v.Provenance.GetSubject(), v.Image.Digest)
	}
	return &v, nil
}

// verifyImage checks that the image desc in the layout at dir (store)
// matches its digests (manifest, config, each layer compressed and not) and
// returns its binary.
func verifyImage(ctx context.Context, store content.Fetcher, dir string, desc ocispec.Descriptor) ([]byte, error) {
	// Each blob against the digest its manifest names first, so that the
	// error names the blob; validate.Image then checks the rest (the
	// uncompressed layers against the config's diff IDs).
	m, err := manifestOf(ctx, store, desc)
	if err != nil {
		return nil, err
	}
	for _, b := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
		if err := verifyBlob(ctx, store, b); err != nil {
			return nil, fmt.Errorf("blob %s (%s): %w", b.Digest, b.MediaType, err)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	h, err := v1.NewHash(desc.Digest.String())
	if err != nil {
		return nil, err
	}
	img, err := idx.Image(h)
	if err != nil {
		return nil, err
	}
	if err := validate.Image(img); err != nil {
		return nil, err
	}
	return Binary(img)
}

// verifyBlob reads the blob d from store and checks its size and digest,
// without holding it in memory.
func verifyBlob(ctx context.Context, store content.Fetcher, d ocispec.Descriptor) error {
	rc, err := store.Fetch(ctx, d)
	if err != nil {
		return err
	}
	defer rc.Close()
	vr := content.NewVerifyReader(rc, d)
	if _, err := io.Copy(io.Discard, vr); err != nil {
		return err
	}
	return vr.Verify()
}

// onlyReferrer returns the one referrer of subject of artifactType in store
// and the content of its one layer, checked against their digests, and
// that the referrer's subject is subject.
func onlyReferrer(ctx context.Context, store content.ReadOnlyGraphStorage, subject ocispec.Descriptor, artifactType string) (ocispec.Descriptor, []byte, error) {
	refs, err := registry.Referrers(ctx, store, subject, artifactType)
	if err != nil {
		return ocispec.Descriptor{}, nil, err
	}
	if len(refs) != 1 {
		return ocispec.Descriptor{}, nil, fmt.Errorf("%d referrers of artifact type %s, want 1", len(refs), artifactType)
	}
	m, err := manifestOf(ctx, store, refs[0])
	if err != nil {
		return refs[0], nil, err
	}
	if m.Subject == nil || m.Subject.Digest != subject.Digest {
		return refs[0], nil, fmt.Errorf("%s: subject is not %s", refs[0].Digest, subject.Digest)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != artifactType {
		return refs[0], nil, fmt.Errorf("%s: want one layer of %s", refs[0].Digest, artifactType)
	}
	data, err := content.FetchAll(ctx, store, m.Layers[0])
	if err != nil {
		return refs[0], nil, fmt.Errorf("%s: layer: %w", refs[0].Digest, err)
	}
	return refs[0], data, nil
}

// mainHash returns the SHA-256 of the SBOM's main component, or "".
func mainHash(bom *cdx.BOM) string {
	if bom.Metadata == nil || bom.Metadata.Component == nil || bom.Metadata.Component.Hashes == nil {
		return ""
	}
	for _, h := range *bom.Metadata.Component.Hashes {
		if h.Algorithm == cdx.HashAlgoSHA256 {
			return h.Value
		}
	}
	return ""
}

// hasSubject says whether st names img's digest as a subject.
func hasSubject(st *intoto.Statement, img ocispec.Descriptor) bool {
	for _, s := range st.GetSubject() {
		if s.GetDigest()[img.Digest.Algorithm().String()] == img.Digest.Encoded() {
			return true
		}
	}
	return false
}
