package hack

import (
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// builtModules lists "path version" of every module, other than the main
// module, that provides a package (tests included) to the build of the
// module in dir, for each set of build tags given.
func builtModules(t *testing.T, dir string, tagSets ...string) map[string]string {
	t.Helper()
	mods := map[string]string{}
	for _, tags := range tagSets {
		cmd := exec.Command("go", "list", "-deps", "-test", "-tags", tags,
			"-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}", "./...")
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			msg := ""
			if ee, ok := err.(*exec.ExitError); ok {
				msg = string(ee.Stderr)
			}
			t.Fatalf("go list -deps -test -tags %q ./... in %s: %v\n%s", tags, dir, err, msg)
		}
		for line := range strings.Lines(string(out)) {
			path, version, ok := strings.Cut(strings.TrimSpace(line), " ")
			if ok {
				mods[path] = version
			}
		}
	}
	return mods
}

// TestNestedModulesBuildWithTheRootsVersions fails when a nested module
// (every go.mod but the root's and hack/tools', which only builds binaries)
// builds a dependency at another version than the root module builds it.
// Why: a package's build ID covers the build IDs of everything it imports,
// so one differing module (x/net, logr, grpc, protobuf...) under k8s.io
// made each nested module compile k8s.io/apiserver, client-go and the rest
// again for itself: minutes of a cold-cache make test. The fix is always
// to raise the root's requirement to the nested module's version
// (go get M@V in the root, then go mod tidy in every module), as the
// nested modules require the root and so never select less than it does.
func TestNestedModulesBuildWithTheRootsVersions(t *testing.T) {
	root := repoRoot(t)
	var nested []string
	err := walkSources(root, func(_, rel string) error {
		if filepath.Base(rel) == "go.mod" && rel != "go.mod" {
			nested = append(nested, filepath.Dir(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("finding the nested modules: %v", err)
	}
	// Sanity: the walk finds the modules we know are there.
	for _, want := range []string{"test/grpc", "test/migrate", "controllerruntime"} {
		if !slices.Contains(nested, want) {
			t.Fatalf("nested modules found: %v; %s is missing, the walk is broken", nested, want)
		}
	}

	// The tags the Makefile and hack/verify.sh build with: the root's
	// e2e, soak and fips tiers, the nested modules' e2e tests.
	rootMods := builtModules(t, root, "", "e2e,soak,fips")
	for _, dir := range nested {
		mods := builtModules(t, filepath.Join(root, dir), "", "e2e")
		shared := 0
		for _, path := range slices.Sorted(maps.Keys(mods)) {
			version := mods[path]
			rootVersion, ok := rootMods[path]
			if !ok {
				continue
			}
			shared++
			if version != rootVersion {
				t.Errorf("%s builds %s %s, the root module %s: raise the root's requirement (go get %s@%s), then go mod tidy in every module",
					dir, path, version, rootVersion, path, version)
			}
		}
		// Every nested module builds on k8s.io/apimachinery through the
		// root module; finding nothing shared means the listing is broken.
		if shared == 0 {
			t.Errorf("%s shares no module with the root module; the listing is broken", dir)
		}
	}
}
