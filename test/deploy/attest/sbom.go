package attest

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"io"
	"runtime/debug"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/uuid"
	"github.com/package-url/packageurl-go"

	"github.com/evercert/evercert/test/deploy/image"
)

// Properties of the SBOM's components that CycloneDX has no field for.
const (
	// PropertyGoSum is a module component's go.sum hash ("h1:..."), as the
	// binary's build information records it: what go mod verify checks.
	PropertyGoSum = "evercert:gomod:sum"
	// PropertyReplaces is, on a module that a replace directive put in
	// place of another, the module path and version it replaced.
	PropertyReplaces = "evercert:gomod:replaces"
	// PropertyBuildSetting prefixes a build setting of the binary (e.g.
	// evercert:gobuild:setting:-trimpath = true, ...:GOARCH = amd64) on the
	// SBOM's main component.
	PropertyBuildSetting = "evercert:gobuild:setting:"
)

// Binary returns the content of the file img's config names as its
// entrypoint: the program package image put in it.
func Binary(img v1.Image) ([]byte, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	if len(cfg.Config.Entrypoint) == 0 {
		return nil, fmt.Errorf("image config: no entrypoint")
	}
	return image.ReadFile(img, cfg.Config.Entrypoint[0])
}

// SBOM returns the CycloneDX SBOM of the Go binary bin, made from the build
// information the go command embedded in it (debug/buildinfo):
//   - metadata.component: the program (its package path, the main module's
//     purl, the SHA-256 of bin, the build settings as properties);
//   - components: every module linked in, with its version, purl
//     (pkg:golang/...) and go.sum hash, a replaced module under its own
//     path with the replacement's version, and the standard library as
//     "std" at the Go version (the purl convention of cyclonedx-gomod);
//   - dependencies: the program depends on each (build information keeps
//     no module graph).
//
// The serial number is derived from bin's hash and no timestamp is set, so
// the same binary gives the same SBOM.
func SBOM(bin []byte) (*cdx.BOM, error) {
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		return nil, fmt.Errorf("go build information: %w", err)
	}
	sum := sha256.Sum256(bin)
	mainPURL := purl(bi.Main.Path, bi.Main.Version)
	settings := make([]cdx.Property, 0, len(bi.Settings))
	for _, s := range bi.Settings {
		settings = append(settings, cdx.Property{Name: PropertyBuildSetting + s.Key, Value: s.Value})
	}
	main := cdx.Component{
		BOMRef:     mainPURL,
		Type:       cdx.ComponentTypeApplication,
		Name:       bi.Path,
		Version:    moduleVersion(bi.Main.Version),
		PackageURL: mainPURL,
		Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: hex.EncodeToString(sum[:])}},
		Properties: &settings,
	}
	std := purl("std", bi.GoVersion)
	components := []cdx.Component{{BOMRef: std, Type: cdx.ComponentTypeLibrary, Name: "std", Version: bi.GoVersion, PackageURL: std}}
	refs := []string{std}
	for _, d := range bi.Deps {
		c := moduleComponent(d)
		components = append(components, c)
		refs = append(refs, c.BOMRef)
	}
	bom := cdx.NewBOM()
	bom.SerialNumber = uuid.NewSHA1(uuid.NameSpaceURL, []byte("sha256:"+hex.EncodeToString(sum[:]))).URN()
	bom.Metadata = &cdx.Metadata{
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{
			Type: cdx.ComponentTypeApplication,
			Name: "github.com/evercert/evercert/test/deploy/attest",
		}}},
		Component: &main,
	}
	bom.Components = &components
	bom.Dependencies = &[]cdx.Dependency{{Ref: main.BOMRef, Dependencies: &refs}}
	return bom, nil
}

// moduleComponent returns the SBOM component of the module m linked into
// the binary.
func moduleComponent(m *debug.Module) cdx.Component {
	version, sum := m.Version, m.Sum
	var props []cdx.Property
	if m.Replace != nil {
		// What is linked is the replacement's code: its version and hash,
		// under the path the program imports.
		version, sum = m.Replace.Version, m.Replace.Sum
		props = append(props, cdx.Property{Name: PropertyReplaces, Value: m.Path + "@" + m.Version + " => " + strings.TrimSpace(m.Replace.Path+" "+m.Replace.Version)})
	}
	if sum != "" {
		props = append(props, cdx.Property{Name: PropertyGoSum, Value: sum})
	}
	p := purl(m.Path, version)
	c := cdx.Component{BOMRef: p, Type: cdx.ComponentTypeLibrary, Name: m.Path, Version: moduleVersion(version), PackageURL: p}
	if len(props) > 0 {
		c.Properties = &props
	}
	return c
}

// moduleVersion returns version, or "" for the "(devel)" of a main module
// built from a checkout (the provenance names its commit).
func moduleVersion(version string) string {
	if version == "(devel)" {
		return ""
	}
	return version
}

// purl returns the package URL of the Go module path at version
// (pkg:golang/<namespace>/<name>@<version>; no version for "(devel)").
func purl(path, version string) string {
	ns, name := "", path
	if i := strings.LastIndex(path, "/"); i >= 0 {
		ns, name = path[:i], path[i+1:]
	}
	return packageurl.NewPackageURL(packageurl.TypeGolang, ns, name, moduleVersion(version), nil, "").ToString()
}

// encodeSBOM writes bom as CycloneDX JSON.
func encodeSBOM(w io.Writer, bom *cdx.BOM) error {
	return cdx.NewBOMEncoder(w, cdx.BOMFileFormatJSON).SetPretty(true).Encode(bom)
}

// decodeSBOM reads CycloneDX JSON.
func decodeSBOM(data []byte) (*cdx.BOM, error) {
	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(bytes.NewReader(data), cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		return nil, fmt.Errorf("CycloneDX JSON: %w", err)
	}
	return &bom, nil
}
