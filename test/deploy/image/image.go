// Package image builds evercert's example programs into OCI container
// images without a Docker daemon and without pulling a base image: each
// image is a static binary (CGO_ENABLED=0) in one layer on an empty base,
// run as user 65532, written as an OCI image layout directory. cmd/image is
// the command line (make image); test/deploy's tests build the same images
// and run what they unpack. Package attest attaches each image's SBOM,
// provenance and signatures to its layout.
//
// See docs/architecture.md for how the packages fit together; this package
// lives in the nested module test/deploy so that the library takes no
// go-containerregistry dependency.
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// User is the numeric user (and group) the images run as: no passwd file is
// needed, and it matches the manifests' runAsUser (distroless' "nonroot").
const User = "65532:65532"

// BinDir is the directory of the binary inside the image.
const BinDir = "/usr/local/bin"

// Example is one program of the repository to package.
type Example struct {
	// Name is the image's and the binary's name, e.g. "webhook".
	Name string
	// Package is the Go package path relative to the repository root,
	// e.g. "./example/webhook".
	Package string
}

// Examples are the programs make image builds, in the order it builds them.
var Examples = []Example{
	{Name: "server", Package: "./example/server"},
	{Name: "webhook", Package: "./example/webhook"},
	{Name: "apiserver", Package: "./example/apiserver"},
	{Name: "signer", Package: "./example/signer"},
}

// Lookup returns the example named name.
func Lookup(name string) (Example, bool) {
	for _, e := range Examples {
		if e.Name == name {
			return e, true
		}
	}
	return Example{}, false
}

// GoBuildFlags are the flags of the go build that compiles every image's
// binary. They make the binary, and so the image's digest, a function of the
// source files and the toolchain alone (make image twice gives the same
// digest; TestImageIsReproducible):
//   - -trimpath: no directory of the machine that built it;
//   - -buildvcs=false: no VCS stamp, so an untracked file or a checkout
//     that is a worktree rather than a clone does not change the binary
//     (the provenance names the commit instead);
//   - -ldflags=-s -w: no symbol table or DWARF, which only make it larger.
//
// GOFLAGS from the environment is cleared for the same reason, so these are
// all the flags the build takes; the provenance records them.
var GoBuildFlags = []string{"-trimpath", "-buildvcs=false", "-ldflags=-s -w"}

// Options say how to build.
type Options struct {
	// RepoRoot is the repository's root directory (holding go.mod).
	// Required.
	RepoRoot string
	// GOARCH of the image. Default runtime.GOARCH. The OS is always linux.
	GOARCH string
}

// Build compiles e statically for linux and returns it as an image: one
// layer holding BinDir/<name>, Entrypoint that binary, User 65532, OCI media
// types, no creation time (the same source gives the same image).
func Build(ctx context.Context, e Example, o Options) (v1.Image, error) {
	imgs, err := BuildAll(ctx, []Example{e}, o)
	if err != nil {
		return nil, err
	}
	return imgs[0], nil
}

// BuildAll builds the image of each of es, as Build does, and returns them
// in the order of es. One go build compiles them all: the go command
// compiles the packages the examples share once and links the binaries in
// parallel, where a go build per example linked them one after the other.
func BuildAll(ctx context.Context, es []Example, o Options) ([]v1.Image, error) {
	if o.RepoRoot == "" {
		return nil, fmt.Errorf("images: RepoRoot is required")
	}
	if len(es) == 0 {
		return nil, nil
	}
	goarch := o.GOARCH
	if goarch == "" {
		goarch = runtime.GOARCH
	}
	tmp, err := os.MkdirTemp("", "evercert-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// go build -o <directory>/ names each binary after the last element of
	// its package path, so two examples must not share that element.
	bins := make([]string, len(es))
	pkgs := make([]string, len(es))
	byBin := map[string]Example{}
	for i, e := range es {
		b := path.Base(e.Package)
		if other, ok := byBin[b]; ok {
			return nil, fmt.Errorf("images %s and %s: packages %s and %s build binaries of the same name %q", other.Name, e.Name, other.Package, e.Package, b)
		}
		byBin[b] = e
		bins[i], pkgs[i] = filepath.Join(tmp, b), e.Package
	}
	args := append(append([]string{"build"}, GoBuildFlags...), "-o", tmp+string(filepath.Separator))
	args = append(args, pkgs...)
	build := exec.CommandContext(ctx, "go", args...)
	build.Dir = o.RepoRoot
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch, "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("images: go build %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	imgs := make([]v1.Image, len(es))
	for i, e := range es {
		if imgs[i], err = imageOf(e, bins[i], goarch); err != nil {
			return nil, err
		}
	}
	return imgs, nil
}

// imageOf returns the image of e holding the binary at bin, built for
// linux/goarch.
func imageOf(e Example, bin, goarch string) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", e.Name, err)
	}
	layerTar, err := singleFileTar(path.Join(BinDir, e.Name), data)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", e.Name, err)
	}
	// The layer is gzipped once and the result kept: without the cache the
	// digest, the layout and a push each compress the whole binary again.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("image %s: layer: %w", e.Name, err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", e.Name, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", e.Name, err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", goarch
	cfg.Config.Entrypoint = []string{path.Join(BinDir, e.Name)}
	cfg.Config.User = User
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.title":  "evercert-example-" + e.Name,
		"org.opencontainers.image.source": "https://github.com/evercert/evercert",
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", e.Name, err)
	}
	return img, nil
}

// singleFileTar returns a tar holding the directories of name and name
// itself (mode 0755, owned by root, times zero).
func singleFileTar(name string, data []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := ""
	for _, part := range strings.Split(strings.Trim(path.Dir(name), "/"), "/") {
		dir += part + "/"
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(name, "/"), Mode: 0o755, Size: int64(len(data)), Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// RefNameAnnotation is the annotation of an OCI layout's index that names
// a manifest (its tag).
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// WriteLayout writes img as an OCI image layout in dir (replacing what was
// there), its manifest annotated with the reference name tag.
func WriteLayout(dir string, img v1.Image, tag string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		RefNameAnnotation: tag,
	})); err != nil {
		return fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	return nil
}

// ReadLayout returns the image of the OCI image layout in dir that
// WriteLayout wrote: the one manifest annotated with a reference name. The
// SBOM, provenance and signatures that package attest adds to the layout
// are manifests too, but carry no reference name (they are found as
// referrers of the image), and the order of the index is not kept when they
// are added.
func ReadLayout(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	var tagged []v1.Descriptor
	for _, d := range m.Manifests {
		if d.Annotations[RefNameAnnotation] != "" {
			tagged = append(tagged, d)
		}
	}
	switch {
	case len(tagged) == 1:
		return idx.Image(tagged[0].Digest)
	case len(tagged) == 0 && len(m.Manifests) == 1:
		return idx.Image(m.Manifests[0].Digest)
	case len(tagged) == 0:
		return nil, fmt.Errorf("OCI layout %s: no image (no manifest has a reference name among %d)", dir, len(m.Manifests))
	default:
		return nil, fmt.Errorf("OCI layout %s: %d manifests have a reference name, want one image", dir, len(tagged))
	}
}

// ReadFile returns the content of the regular file at name (an absolute
// path, e.g. the entrypoint) in img's flattened file system.
func ReadFile(img v1.Image, name string) ([]byte, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	want := strings.TrimPrefix(path.Clean(name), "/")
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("image: no file %s", name)
		}
		if err != nil {
			return nil, fmt.Errorf("image: reading %s: %w", name, err)
		}
		if strings.TrimPrefix(path.Clean(h.Name), "/") == want && h.Typeflag == tar.TypeReg {
			return io.ReadAll(tr)
		}
	}
}

// Unpack writes the image's flattened file system under root, which must
// exist, and returns the image's config. Only directories and regular files
// are expected (an image Build made); anything else, or a path leaving
// root, is an error.
func Unpack(img v1.Image, root string) (*v1.ConfigFile, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return cfg, nil
		}
		if err != nil {
			return nil, fmt.Errorf("unpack: %w", err)
		}
		target := filepath.Join(root, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(target, filepath.Clean(root)+string(filepath.Separator)) {
			return nil, fmt.Errorf("unpack: %q leaves the root", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return nil, err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unpack: %q: unexpected type %q", h.Name, h.Typeflag)
		}
	}
}
