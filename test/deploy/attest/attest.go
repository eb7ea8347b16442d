// Package attest attaches to an image that package image built, in the
// same OCI image layout, what a cluster operator checks before running it:
//
//   - an SBOM: CycloneDX JSON made from the Go build information of the
//     binary in the image (its main module, every dependency module with
//     its version and go.sum hash, the Go version and the build settings);
//   - a provenance: an in-toto Statement with a SLSA provenance v1
//     predicate whose subject is the image's manifest digest and whose
//     build definition is the go build (package, flags, Go version) of the
//     source commit;
//   - signatures: cosign's simple signing payload over the image's digest,
//     and over the SBOM's and the provenance's manifest digests, signed with
//     a key given to the build.
//
// Each is an OCI 1.1 artifact manifest whose subject is what it describes
// (the SBOM and provenance: the image; a signature: what it signs), so a
// registry's referrers API, oras discover and cosign find them. Verify
// checks all of it against a public key.
//
// The formats come from their libraries: CycloneDX's cyclonedx-go, the
// in-toto attestation Go types, sigstore's signature and payload packages,
// and oras-go for the layout and its referrers.
//
// See docs/operating.md ("Images") for the commands and how a release would
// sign keylessly.
package attest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore/pkg/signature"
	oras "oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"
	"oras.land/oras-go/v2/errdef"

	"github.com/evercert/evercert/test/deploy/image"
)

// The artifact types and media types of what Attach adds to a layout.
const (
	// SBOMArtifactType is the artifactType of the SBOM's manifest and the
	// media type of its one layer (CycloneDX JSON).
	SBOMArtifactType = "application/vnd.cyclonedx+json"
	// ProvenanceArtifactType is the artifactType of the provenance's
	// manifest and the media type of its one layer (an in-toto Statement).
	ProvenanceArtifactType = "application/vnd.in-toto+json"
	// SignatureArtifactType is the artifactType of a signature's manifest,
	// as cosign writes it in OCI 1.1 referrers mode.
	SignatureArtifactType = "application/vnd.dev.cosign.artifact.sig.v1+json"
	// SimpleSigningMediaType is the media type of a signature manifest's
	// layer: the signed payload, cosign's simple signing JSON.
	SimpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	// SignatureAnnotation is the annotation of that layer's descriptor
	// holding the base64 signature over the payload (cosign's).
	SignatureAnnotation = "dev.cosignproject.cosign/signature"
)

// Repository is the source repository the provenance names.
const Repository = "https://github.com/evercert/evercert"

// Source is what an image was built from, as the provenance names it.
type Source struct {
	// Commit is the full git commit hash of the checkout's HEAD.
	Commit string
	// Modified says the work tree differed from Commit (git status listed
	// a change or an untracked file): the provenance says so rather than
	// claim the commit alone.
	Modified bool
	// Time is the build's timestamp: SOURCE_DATE_EPOCH if set, else the
	// commit time. It dates the SBOM's and the provenance's manifests
	// (org.opencontainers.image.created), never the current time, so that
	// they too come out the same from the same source.
	Time time.Time
}

// SourceOf returns the Source of the git checkout at repoRoot. It runs git
// (commands named in the error when they fail).
func SourceOf(ctx context.Context, repoRoot string) (Source, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", repoRoot}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("source of %s: git %s: %w: %s", repoRoot, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(string(out)), nil
	}
	var s Source
	var err error
	if s.Commit, err = git("rev-parse", "HEAD"); err != nil {
		return Source{}, err
	}
	status, err := git("status", "--porcelain")
	if err != nil {
		return Source{}, err
	}
	s.Modified = status != ""
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		if epoch, err = git("log", "-1", "--format=%ct", "HEAD"); err != nil {
			return Source{}, err
		}
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return Source{}, fmt.Errorf("source of %s: build time %q: %w", repoRoot, epoch, err)
	}
	s.Time = time.Unix(sec, 0).UTC()
	return s, nil
}

// Options say what Attach attaches.
type Options struct {
	// Example is the program the image holds. Required.
	Example image.Example
	// Source is what the image was built from. Required.
	Source Source
	// Signer signs the image's, the SBOM's and the provenance's digests.
	// Nil attaches them unsigned (and Verify refuses the layout).
	Signer signature.Signer
	// Identity is the image reference the signatures claim
	// (docker-reference), e.g. registry.example.com/evercert/example-webhook.
	// Default "evercert/example-<name>".
	Identity string
}

// Attached are the descriptors of what Attach wrote.
type Attached struct {
	// Image is the image's manifest, the subject of the others.
	Image ocispec.Descriptor
	// SBOM and Provenance are the artifact manifests of each.
	SBOM, Provenance ocispec.Descriptor
	// Signatures are the signature manifests: of the image, the SBOM and
	// the provenance, in that order. Empty when Options.Signer is nil.
	Signatures []ocispec.Descriptor
}

// Attach makes the SBOM and the provenance of img, which must be the image
// tagged tag in the OCI layout in dir (package image's WriteLayout), and
// writes them into that layout as referrers of it; with a Signer, it signs
// the image, the SBOM and the provenance, each signature a referrer of
// what it signs. It is meant for a layout WriteLayout has just written
// (cmd/image writes both); two Attach calls must not run on one layout at
// once.
func Attach(ctx context.Context, dir, tag string, img v1.Image, o Options) (Attached, error) {
	var a Attached
	fail := func(what string, err error) (Attached, error) {
		return Attached{}, fmt.Errorf("attest %s (%s): %s: %w", o.Example.Name, dir, what, err)
	}
	bin, err := Binary(img)
	if err != nil {
		return fail("binary", err)
	}
	bom, err := SBOM(bin)
	if err != nil {
		return fail("SBOM", err)
	}
	var sbomJSON bytes.Buffer
	if err := encodeSBOM(&sbomJSON, bom); err != nil {
		return fail("SBOM", err)
	}
	store, err := oci.NewWithContext(ctx, dir)
	if err != nil {
		return fail("layout", err)
	}
	if a.Image, err = store.Resolve(ctx, tag); err != nil {
		return fail("image "+tag, err)
	}
	want, err := img.Digest()
	if err != nil {
		return fail("image digest", err)
	}
	if a.Image.Digest.String() != want.String() {
		return fail("image "+tag, fmt.Errorf("the layout holds %s, the image given is %s", a.Image.Digest, want))
	}
	prov, err := Provenance(a.Image, bin, o.Example, o.Source)
	if err != nil {
		return fail("provenance", err)
	}
	created := map[string]string{ocispec.AnnotationCreated: o.Source.Time.UTC().Format(time.RFC3339)}
	if a.SBOM, err = pushArtifact(ctx, store, a.Image, SBOMArtifactType, SBOMArtifactType, sbomJSON.Bytes(), nil, created); err != nil {
		return fail("SBOM", err)
	}
	if a.Provenance, err = pushArtifact(ctx, store, a.Image, ProvenanceArtifactType, ProvenanceArtifactType, prov, nil, created); err != nil {
		return fail("provenance", err)
	}
	if o.Signer == nil {
		return a, nil
	}
	identity := o.Identity
	if identity == "" {
		identity = "evercert/example-" + o.Example.Name
	}
	for _, s := range []struct {
		what string
		desc ocispec.Descriptor
	}{{"image", a.Image}, {"SBOM", a.SBOM}, {"provenance", a.Provenance}} {
		sig, err := sign(ctx, store, s.desc, identity, o.Signer, created)
		if err != nil {
			return fail("signing the "+s.what, err)
		}
		a.Signatures = append(a.Signatures, sig)
	}
	return a, nil
}

// pushArtifact writes data as a blob of media type layerMediaType
// (annotated with layerAnnotations) and an OCI 1.1 artifact manifest of
// artifactType holding it, with subject as its subject, and returns the
// manifest's descriptor. The SBOM's and provenance's layer media type is
// their artifact type; a signature's layer is its payload.
func pushArtifact(ctx context.Context, store *oci.Store, subject ocispec.Descriptor, artifactType, layerMediaType string, data []byte, layerAnnotations, manifestAnnotations map[string]string) (ocispec.Descriptor, error) {
	layer := content.NewDescriptorFromBytes(layerMediaType, data)
	layer.Annotations = layerAnnotations
	if err := store.Push(ctx, layer, bytes.NewReader(data)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
		return ocispec.Descriptor{}, err
	}
	return oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, artifactType, oras.PackManifestOptions{
		Subject:             &subject,
		Layers:              []ocispec.Descriptor{layer},
		ManifestAnnotations: manifestAnnotations,
	})
}

// manifestOf fetches desc from store, verifying its size and digest, and
// decodes it as an image manifest.
func manifestOf(ctx context.Context, store content.Fetcher, desc ocispec.Descriptor) (ocispec.Manifest, error) {
	var m ocispec.Manifest
	data, err := content.FetchAll(ctx, store, desc)
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return m, nil
}
