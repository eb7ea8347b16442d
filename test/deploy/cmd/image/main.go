// Command image builds evercert's example programs into OCI container images
// without a Docker daemon and without pulling a base image (package image),
// and writes each as an OCI image layout directory; with --push it also
// pushes them to a registry. make image runs it:
//
//	go run ./cmd/image --repo-root ../.. --out ../../tmp/images             # tmp/images/<name>
//	go run ./cmd/image --repo-root ../.. --out ../../tmp/images \
//	    --push registry.example.com/evercert/example-{name}:v1                 # and push
//
// Pushing uses the credentials of ~/.docker/config.json (crane auth login,
// docker login); it is not tested (no registry is reachable in the tests).
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

	"github.com/evercert/evercert/test/deploy/image"
)

func main() {
	repoRoot := flag.String("repo-root", ".", "The evercert repository's root directory.")
	out := flag.String("out", "tmp/images", "Directory under which each image is written as an OCI image layout, <out>/<name>.")
	only := flag.String("examples", "", "Comma-separated examples to build (server, webhook, apiserver, signer). Empty builds all.")
	goarch := flag.String("goarch", "", "GOARCH of the images. Empty is the machine's.")
	tag := flag.String("tag", "latest", "Reference name annotated in each layout (org.opencontainers.image.ref.name).")
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
		fmt.Printf("%s: %s (%s)\n", e.Name, dir, digest)
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
