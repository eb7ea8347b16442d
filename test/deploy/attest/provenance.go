package attest

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"strings"

	slsa "github.com/in-toto/attestation/go/predicates/provenance/v1"
	intoto "github.com/in-toto/attestation/go/v1"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/evercert/evercert/test/deploy/image"
)

// SLSAProvenanceV1 is the predicate type of the provenance.
const SLSAProvenanceV1 = "https://slsa.dev/provenance/v1"

// BuildType is the provenance's buildDefinition.buildType: a go build of
// one package of the repository by package image (image.GoBuildFlags,
// CGO_ENABLED=0, GOOS=linux) into one layer on an empty base. Its
// externalParameters are repository, ref, package, goos and goarch; its
// internalParameters goVersion, flags and buildSettings (every setting the
// binary's build information records).
const BuildType = Repository + "/tree/main/test/deploy/image#go-build-v1"

// BuilderID is the provenance's runDetails.builder.id: make image
// (test/deploy/cmd/image) run from a checkout.
const BuilderID = Repository + "/tree/main/test/deploy/cmd/image"

// Provenance returns the in-toto Statement (JSON) whose subject is the
// image manifest subject and whose predicate is the SLSA provenance v1 of
// its build: e built from src with package image's flags, the Go version
// and build settings read from bin, the binary in the image. It holds no
// time of its own, so the same build gives the same statement.
func Provenance(subject ocispec.Descriptor, bin []byte, e image.Example, src Source) ([]byte, error) {
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		return nil, fmt.Errorf("go build information: %w", err)
	}
	settings := map[string]any{}
	var goos, goarch string
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
		switch s.Key {
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	flags := make([]any, len(image.GoBuildFlags))
	for i, f := range image.GoBuildFlags {
		flags[i] = f
	}
	external, err := structpb.NewStruct(map[string]any{
		"repository": Repository,
		"ref":        src.Commit,
		"package":    e.Package,
		"goos":       goos,
		"goarch":     goarch,
	})
	if err != nil {
		return nil, err
	}
	internal, err := structpb.NewStruct(map[string]any{
		"goVersion":     bi.GoVersion,
		"flags":         flags,
		"buildSettings": settings,
	})
	if err != nil {
		return nil, err
	}
	srcAnnotations, err := structpb.NewStruct(map[string]any{"modified": src.Modified})
	if err != nil {
		return nil, err
	}
	pred := &slsa.Provenance{
		BuildDefinition: &slsa.BuildDefinition{
			BuildType:          BuildType,
			ExternalParameters: external,
			InternalParameters: internal,
			ResolvedDependencies: []*intoto.ResourceDescriptor{
				{
					Uri:         "git+" + Repository + "@" + src.Commit,
					Digest:      map[string]string{string(intoto.AlgorithmGitCommit): src.Commit},
					Annotations: srcAnnotations,
				},
				{Name: "go", Uri: purl("std", bi.GoVersion)},
			},
		},
		RunDetails: &slsa.RunDetails{Builder: &slsa.Builder{Id: BuilderID}},
	}
	if err := pred.Validate(); err != nil {
		return nil, fmt.Errorf("SLSA provenance: %w", err)
	}
	predJSON, err := protojson.Marshal(pred)
	if err != nil {
		return nil, err
	}
	var predStruct structpb.Struct
	if err := protojson.Unmarshal(predJSON, &predStruct); err != nil {
		return nil, err
	}
	algo, hexDigest, ok := strings.Cut(subject.Digest.String(), ":")
	if !ok {
		return nil, fmt.Errorf("subject digest %q", subject.Digest)
	}
	st := &intoto.Statement{
		Type:          intoto.StatementTypeUri,
		Subject:       []*intoto.ResourceDescriptor{{Name: "evercert/example-" + e.Name, Digest: map[string]string{algo: hexDigest}}},
		PredicateType: SLSAProvenanceV1,
		Predicate:     &predStruct,
	}
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("in-toto statement: %w", err)
	}
	out, err := protojson.Marshal(st)
	if err != nil {
		return nil, err
	}
	// protojson varies its whitespace on purpose; compacting makes the
	// bytes, and so the manifest's digest, a function of the content.
	var compact bytes.Buffer
	if err := json.Compact(&compact, out); err != nil {
		return nil, err
	}
	return compact.Bytes(), nil
}

// decodeProvenance reads an in-toto Statement and its SLSA provenance v1
// predicate, validating both.
func decodeProvenance(data []byte) (*intoto.Statement, *slsa.Provenance, error) {
	var st intoto.Statement
	if err := protojson.Unmarshal(data, &st); err != nil {
		return nil, nil, fmt.Errorf("in-toto statement: %w", err)
	}
	if err := st.Validate(); err != nil {
		return nil, nil, fmt.Errorf("in-toto statement: %w", err)
	}
	if st.GetPredicateType() != SLSAProvenanceV1 {
		return nil, nil, fmt.Errorf("in-toto statement: predicate type %q, want %q", st.GetPredicateType(), SLSAProvenanceV1)
	}
	predJSON, err := protojson.Marshal(st.GetPredicate())
	if err != nil {
		return nil, nil, err
	}
	var pred slsa.Provenance
	if err := protojson.Unmarshal(predJSON, &pred); err != nil {
		return nil, nil, fmt.Errorf("SLSA provenance: %w", err)
	}
	if err := pred.Validate(); err != nil {
		return nil, nil, fmt.Errorf("SLSA provenance: %w", err)
	}
	return &st, &pred, nil
}
