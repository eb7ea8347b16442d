// Command kustomize-bases writes the kustomize bases of deploy/kustomize
// from the Helm charts of deploy/helm rendered with their default values
// (make generate-kustomize): the charts are the source of both.
// TestKustomizeBasesAreTheChartRendered fails until it has been run after
// a chart changed.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/evercert/evercert/test/deploy/chart"
)

func main() {
	root := flag.String("repo-root", "../..", "the evercert repository's root")
	flag.Parse()
	for _, d := range chart.Deployables {
		written, err := d.WriteBase(*root)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kustomize-bases:", err)
			os.Exit(1)
		}
		for _, p := range written {
			fmt.Println("wrote", p)
		}
	}
}
