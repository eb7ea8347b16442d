// Command image builds evercert's example programs into OCI container images
// without a Docker daemon and without pulling a base image (package image),
// writes each as an OCI image layout directory and attaches to it, as OCI
// referrers, its CycloneDX SBOM and its in-toto SLSA provenance, signed
// with --signing-key if given (package attest); with --push it also pushes
// the images to a registry. make image runs it:
//
//	go run ./cmd/image --repo-root ../.. --out ../../tmp/images             # tmp/images/<name>
//	go run ./cmd/image --repo-root ../.. --out ../../tmp/images \
//	    --signing-key cosign.key                                             # and sign
//	go run ./cmd/image --repo-root ../.. --out ../../tmp/images \
//	    --push registry.example.com/evercert/example-{name}:v1                 # and push
//	go run ./cmd/image verify --layout ../../tmp/images/webhook --public-key cosign.pub
//
// The signing key is an unencrypted PEM ECDSA P-256 private key (openssl
// ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt).
// Without one the images are not signed, and it says so.
//
// Pushing uses the credentials of ~/.docker/config.json (crane auth login,
// docker login) and pushes the images alone, not their referrers (copy the
// layout with oras cp -r, or sign the pushed digest with cosign); it is not
// tested (no registry is reachable in the tests).
//
// See docs/architecture.md for how the packages fit together.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/sigstore/pkg/signature"

	"github.com/evercert/evercert/test/deploy/attest"
	"github.com/evercert/evercert/test/deploy/image"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "verify" {
		os.Exit(verify(os.Args[2:]))
	}
	repoRoot := flag.String("repo-root", ".", "The evercert repository's root directory.")
	out := flag.String("out", "tmp/images", "Directory under which each image is written as an OCI image layout, <out>/<name>.")
	only := flag.String("examples", "", "Comma-separated examples to build (server, webhook, apiserver, signer). Empty builds all.")
	goarch := flag.String("goarch", "", "GOARCH of the images. Empty is the machine's.")
	tag := flag.String("tag", "latest", "Reference name annotated in each layout (org.opencontainers.image.ref.name).")
	signingKey := flag.String("signing-key", "", "PEM ECDSA P-256 private key file that signs each image, its SBOM and its provenance. Empty: not signed.")
	identity := flag.String("identity", "evercert/example-{name}", "Image reference the signatures claim (docker-reference), {name} replaced by the example's name.")
	push := flag.String("push", "", "If set, push each image to this reference, {name} replaced by the example's name, e.g. registry.example.com/evercert/example-{name}:v1.")
	flag.Parse()

	examples := image.Examples
	if *only != "" {
		examples = nil
		for _, n := range strings.Split(*only, ",") {
			e, ok := image.Lookup(strings.TrimSpace(n))
			if !ok {
				fmt.Fprintf(os.Stderr, "--examples: unknown example %q\n", n)
				os.Exit(2)
			}
			examples = append(examples, e)
		}
	}
	if *push != "" && !strings.Contains(*push, "{name}") && len(examples) > 1 {
		fmt.Fprintln(os.Stderr, "--push: must contain {name} when more than one example is built")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var signer signature.Signer
	if *signingKey == "" {
		fmt.Fprintln(os.Stderr, "image: no --signing-key: the images, SBOMs and provenance are NOT signed (image verify refuses them)")
	} else {
		var err error
		if signer, err = attest.LoadSigner(*signingKey); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	src, err := attest.SourceOf(ctx, *repoRoot)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if src.Modified {
		fmt.Fprintf(os.Stderr, "image: the work tree differs from commit %s; the provenance says so\n", src.Commit)
	}
	imgs, err := image.BuildAll(ctx, examples, image.Options{RepoRoot: *repoRoot, GOARCH: *goarch})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for i, e := range examples {
		img := imgs[i]
		dir := filepath.Join(*out, e.Name)
		if err := image.WriteLayout(dir, img, *tag); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		digest, err := img.Digest()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		a, err := attest.Attach(ctx, dir, *tag, img, attest.Options{
			Example:  e,
			Source:   src,
			Signer:   signer,
			Identity: strings.ReplaceAll(*identity, "{name}", e.Name),
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%s: %s (%s), SBOM %s, provenance %s, %d signatures\n", e.Name, dir, digest, a.SBOM.Digest, a.Provenance.Digest, len(a.Signatures))
		if *push == "" {
			continue
		}
		ref, err := name.ParseReference(strings.ReplaceAll(*push, "{name}", e.Name))
		if err != nil {
			fmt.Fprintf(os.Stderr, "--push: %v\n", err)
			os.Exit(2)
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			fmt.Fprintf(os.Stderr, "push %s: %v\n", ref, err)
			os.Exit(1)
		}
		fmt.Printf("%s: pushed %s@%s\n", e.Name, ref.Context(), digest)
	}
}

// verify is the verify subcommand: it checks an image layout that image
// wrote against a public key (attest.Verify) and prints what it verified.
// It returns the exit code: 0 verified, 1 not, 2 a usage error.
func verify(args []string) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	dir := fs.String("layout", "", "OCI image layout directory of one image, e.g. tmp/images/webhook.")
	tag := fs.String("tag", "latest", "Reference name of the image in the layout.")
	pub := fs.String("public-key", "", "PEM public key file (PKIX) of the signing key.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *pub == "" {
		fmt.Fprintln(os.Stderr, "verify: --layout and --public-key are required")
		return 2
	}
	v, err := attest.LoadVerifier(*pub)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	got, err := attest.Verify(context.Background(), *dir, *tag, v)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	n := 0
	if got.SBOM.Components != nil {
		n = len(*got.SBOM.Components)
	}
	fmt.Printf("verified %s@%s: signature, SBOM (%d components), provenance (source %s)\n",
		*dir, got.Image.Digest, n, got.Build.GetBuildDefinition().GetExternalParameters().GetFields()["ref"].GetStringValue())
	return 0
}
