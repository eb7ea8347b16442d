package deploy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	oras "oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"

	"github.com/evercert/evercert/test/deploy/attest"
	"github.com/evercert/evercert/test/deploy/image"
)

// TestImageIsReproducible: make image twice gives the same digest. The
// webhook's image is built a second time, by its own go build into its own
// temporary directory, and its digest compared with that of the first build
// (the one every image test shares). A timestamp in the config or the
// layer, the build directory or a VCS stamp in the binary, or an
// environment GOFLAGS reaching the build would make them differ; the
// failure names which part did.
func TestImageIsReproducible(t *testing.T) {
	start := time.Now()
	first, err := image.ReadLayout(exampleImage(t, "webhook").layout)
	if err != nil {
		t.Fatal(err)
	}
	shared := time.Since(start)
	e, _ := image.Lookup("webhook")
	imgs, err := image.BuildAll(context.Background(), []image.Example{e}, image.Options{RepoRoot: repoRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	// For the record (make test-deploy's added time), not asserted.
	t.Logf("waited %v for the shared build, built the webhook again in %v", shared.Round(time.Millisecond), (time.Since(start) - shared).Round(time.Millisecond))
	dir := filepath.Join(t.TempDir(), "webhook")
	if err := image.WriteLayout(dir, imgs[0], "again"); err != nil {
		t.Fatal(err)
	}
	second, err := image.ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := digestOf(t, first.Digest), digestOf(t, second.Digest)
	t.Logf("webhook image built twice: %s, %s", d1, d2)
	if d1 == d2 {
		return
	}
	c1, c2 := digestOf(t, first.ConfigName), digestOf(t, second.ConfigName)
	if c1 != c2 {
		f1, _ := first.RawConfigFile()
		f2, _ := second.RawConfigFile()
		t.Errorf("configs differ: %s\n%s\n%s", c1, f1, f2)
	}
	l1, l2 := layerDigests(t, first), layerDigests(t, second)
	if !slices.Equal(l1, l2) {
		b1, _ := attest.Binary(first)
		b2, _ := attest.Binary(second)
		t.Errorf("layers differ: %v, %v (binaries equal: %v)", l1, l2, bytes.Equal(b1, b2))
	}
	t.Fatalf("make image twice gave two digests: %s, %s", d1, d2)
}

// TestImageAttestationsVerify: the webhook's image with its SBOM, its
// provenance and their signatures attached (what make image --signing-key
// writes) verifies against the public key, and what verified says the
// truth: the SBOM lists the modules linked in at the versions the
// repository's go.mod selects (k8s.io/client-go, golang.org/x/crypto)
// with their go.sum hashes and purls, the Go version and the build flags;
// the provenance's subject is the image's digest and its build is the
// example's package at the checkout's commit with package image's flags.
func TestImageAttestationsVerify(t *testing.T) {
	k := newTestKey(t)
	dir, img, a := attestedWebhook(t, k.signer)
	v, err := attest.Verify(context.Background(), dir, "test", k.verifier)
	if err != nil {
		t.Fatal(err)
	}
	digest := digestOf(t, img.Digest)
	if v.Image.Digest.String() != digest || a.Image.Digest.String() != digest {
		t.Fatalf("verified image %s, attached to %s, want %s", v.Image.Digest, a.Image.Digest, digest)
	}
	if len(a.Signatures) != 3 {
		t.Errorf("%d signatures, want 3 (image, SBOM, provenance)", len(a.Signatures))
	}
	// The layout still reads as the image (the referrers carry no name).
	if again, err := image.ReadLayout(dir); err != nil || digestOf(t, again.Digest) != digest {
		t.Errorf("image.ReadLayout after Attach: %v, %v", again, err)
	}

	root := repoRoot(t)
	byName := map[string]cdx.Component{}
	for _, c := range *v.SBOM.Components {
		byName[c.Name] = c
	}
	for _, mod := range []string{"k8s.io/client-go", "golang.org/x/crypto"} {
		want := goOutput(t, root, "list", "-m", "-f", "{{.Version}}", mod)
		c, ok := byName[mod]
		if !ok {
			t.Errorf("SBOM: no component %s", mod)
			continue
		}
		if c.Version != want || c.PackageURL != "pkg:golang/"+mod+"@"+want {
			t.Errorf("SBOM: %s version %q purl %q, want %s (the repository's go.mod)", mod, c.Version, c.PackageURL, want)
		}
		if !hasProperty(c.Properties, attest.PropertyGoSum, "h1:") {
			t.Errorf("SBOM: %s has no go.sum hash: %v", mod, c.Properties)
		}
	}
	if std := byName["std"]; std.Version != goOutput(t, root, "env", "GOVERSION") {
		t.Errorf("SBOM: std at %q, want the go command's version", std.Version)
	}
	mainC := v.SBOM.Metadata.Component
	if mainC.Name != "github.com/evercert/evercert/example/webhook" || mainC.PackageURL != "pkg:golang/github.com/evercert/evercert" {
		t.Errorf("SBOM: main component %q %q", mainC.Name, mainC.PackageURL)
	}
	for _, s := range []string{"-trimpath=true", "CGO_ENABLED=0", "GOOS=linux"} {
		key, val, _ := strings.Cut(s, "=")
		if !hasProperty(mainC.Properties, attest.PropertyBuildSetting+key, val) {
			t.Errorf("SBOM: build setting %s missing: %v", s, mainC.Properties)
		}
	}

	subj := v.Provenance.GetSubject()
	if len(subj) != 1 || "sha256:"+subj[0].GetDigest()["sha256"] != digest {
		t.Errorf("provenance subject %v, want %s", subj, digest)
	}
	ext := v.Build.GetBuildDefinition().GetExternalParameters().GetFields()
	if got := ext["package"].GetStringValue(); got != "./example/webhook" {
		t.Errorf("provenance package %q", got)
	}
	if got, want := ext["ref"].GetStringValue(), gitOutput(t, root, "rev-parse", "HEAD"); got != want {
		t.Errorf("provenance source commit %q, want %q", got, want)
	}
	var flags []string
	for _, f := range v.Build.GetBuildDefinition().GetInternalParameters().GetFields()["flags"].GetListValue().GetValues() {
		flags = append(flags, f.GetStringValue())
	}
	if !slices.Equal(flags, image.GoBuildFlags) {
		t.Errorf("provenance flags %q, want %q", flags, image.GoBuildFlags)
	}
	t.Logf("verified %s: SBOM of %d components, provenance of commit %s", digest, len(*v.SBOM.Components), ext["ref"].GetStringValue())
}

// TestImageVerifyRefusesTampering: each way a layout may be tampered with
// or left unsigned fails verification with an error that names what
// failed.
func TestImageVerifyRefusesTampering(t *testing.T) {
	k := newTestKey(t)
	ctx := context.Background()
	cases := []struct {
		name string
		// signer attaches; nil: unsigned.
		signer signature.Signer
		// tamper changes the layout after Attach.
		tamper func(t *testing.T, dir string, a attest.Attached)
		// verifier verifies; nil: k's.
		verifier signature.Verifier
		want     []string
	}{{
		name: "unsigned",
		want: []string{"image sha256:", "not signed"},
	}, {
		name:     "another key",
		signer:   k.signer,
		verifier: newTestKey(t).verifier,
		want:     []string{"image sha256:", "no signature verifies with the public key"},
	}, {
		name:   "layer changed",
		signer: k.signer,
		tamper: func(t *testing.T, dir string, a attest.Attached) {
			flipByte(t, blobPath(dir, onlyLayer(t, dir, a.Image)))
		},
		want: []string{"image sha256:", "blob sha256:", "(application/vnd.oci.image.layer.v1.tar+gzip): mismatched digest"},
	}, {
		name:   "SBOM swapped",
		signer: k.signer,
		tamper: func(t *testing.T, dir string, a attest.Attached) {
			// The server's SBOM, in place of the webhook's.
			server, err := image.ReadLayout(exampleImage(t, "server").layout)
			if err != nil {
				t.Fatal(err)
			}
			bin, err := attest.Binary(server)
			if err != nil {
				t.Fatal(err)
			}
			bom, err := attest.SBOM(bin)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON).Encode(bom); err != nil {
				t.Fatal(err)
			}
			s := mustStore(t, dir)
			layer := content.NewDescriptorFromBytes(attest.SBOMArtifactType, buf.Bytes())
			if err := s.Push(ctx, layer, bytes.NewReader(buf.Bytes())); err != nil {
				t.Fatal(err)
			}
			if _, err := oras.PackManifest(ctx, s, oras.PackManifestVersion1_1, attest.SBOMArtifactType, oras.PackManifestOptions{
				Subject: &a.Image, Layers: []ocispec.Descriptor{layer},
			}); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, a.SBOM); err != nil {
				t.Fatal(err)
			}
		},
		want: []string{"SBOM sha256:", "not signed"},
	}, {
		name:   "SBOM content replaced",
		signer: k.signer,
		tamper: func(t *testing.T, dir string, a attest.Attached) {
			flipByte(t, blobPath(dir, onlyLayer(t, dir, a.SBOM)))
		},
		want: []string{"SBOM:", "layer"},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, _, a := attestedWebhook(t, c.signer)
			if c.tamper != nil {
				c.tamper(t, dir, a)
			}
			verifier := c.verifier
			if verifier == nil {
				verifier = k.verifier
			}
			_, err := attest.Verify(ctx, dir, "test", verifier)
			if err == nil {
				t.Fatal("verified")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
}

// testKey is a signing key as make image takes it: PEM files.
type testKey struct {
	signer   signature.Signer
	verifier signature.Verifier
}

// newTestKey writes a new ECDSA P-256 key pair as PEM files and loads them
// as cmd/image does.
func newTestKey(t *testing.T) testKey {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyFile, pubFile := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubFile, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	var k testKey
	if k.signer, err = attest.LoadSigner(keyFile); err != nil {
		t.Fatal(err)
	}
	if k.verifier, err = attest.LoadVerifier(pubFile); err != nil {
		t.Fatal(err)
	}
	return k
}

// attestedWebhook writes the webhook's image (the shared build) as a fresh
// layout tagged "test" and attaches its SBOM and provenance, signed by
// signer unless it is nil.
func attestedWebhook(t *testing.T, signer signature.Signer) (string, v1.Image, attest.Attached) {
	t.Helper()
	img, err := image.ReadLayout(exampleImage(t, "webhook").layout)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "webhook")
	if err := image.WriteLayout(dir, img, "test"); err != nil {
		t.Fatal(err)
	}
	src, err := attest.SourceOf(context.Background(), repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := image.Lookup("webhook")
	a, err := attest.Attach(context.Background(), dir, "test", img, attest.Options{Example: e, Source: src, Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	return dir, img, a
}

func mustStore(t *testing.T, dir string) *oci.Store {
	t.Helper()
	s, err := oci.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// flipByte changes the last byte of the file at path.
func flipByte(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-1] ^= 0xff
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// onlyLayer returns the one layer of the manifest m in the layout at dir.
func onlyLayer(t *testing.T, dir string, m ocispec.Descriptor) ocispec.Descriptor {
	t.Helper()
	data, err := content.FetchAll(context.Background(), mustStore(t, dir), m)
	if err != nil {
		t.Fatal(err)
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(data, &man); err != nil {
		t.Fatal(err)
	}
	if len(man.Layers) != 1 {
		t.Fatalf("manifest %s: %d layers, want 1", m.Digest, len(man.Layers))
	}
	return man.Layers[0]
}

// blobPath is where the layout at dir keeps the blob of d.
func blobPath(dir string, d ocispec.Descriptor) string {
	return filepath.Join(dir, "blobs", d.Digest.Algorithm().String(), d.Digest.Encoded())
}

func digestOf(t *testing.T, f func() (v1.Hash, error)) string {
	t.Helper()
	h, err := f()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

func layerDigests(t *testing.T, img v1.Image) []string {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		out = append(out, digestOf(t, l.Digest))
	}
	return out
}

func hasProperty(props *[]cdx.Property, name, valuePrefix string) bool {
	if props == nil {
		return false
	}
	for _, p := range *props {
		if p.Name == name && strings.HasPrefix(p.Value, valuePrefix) {
			return true
		}
	}
	return false
}

// goOutput runs the go command in dir and returns its trimmed output.
func goOutput(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return commandOutput(t, dir, "go", args...)
}

func gitOutput(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return commandOutput(t, dir, "git", args...)
}

func commandOutput(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}
