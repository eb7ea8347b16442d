package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/test/deploy/image"
)

func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }

// fieldManager applies the bases in the tests.
const fieldManager = "evercert-test-deploy"

// base is one kustomize base of deploy/kustomize and what the tests need to
// know about it. Everything else they read from the rendered objects.
type base struct {
	// dir under deploy/kustomize, also the image's name.
	dir string
	// namespace and serviceAccount the program runs in and as.
	namespace, serviceAccount string
}

var bases = []base{
	{dir: "webhook", namespace: "evercert-example-webhook", serviceAccount: "evercert-example-webhook"},
	{dir: "apiserver", namespace: "evercert-example-apiserver", serviceAccount: "evercert-example-apiserver"},
	{dir: "signer", namespace: "evercert-signer", serviceAccount: "evercert-signer"},
}

// repoRoot is the evercert repository's root: this module is test/deploy.
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// render builds deploy/kustomize/<dir> with the kustomize API, as
// kubectl apply -k / kustomize build would, from the files on disk.
func render(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "kustomize", dir))
	if err != nil {
		t.Fatalf("kustomize build deploy/kustomize/%s: %v", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatalf("deploy/kustomize/%s: %s: %v", dir, r.CurId(), err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	if len(objs) == 0 {
		t.Fatalf("deploy/kustomize/%s renders nothing", dir)
	}
	return objs
}

// only returns the objects of kind.
func only(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// one returns the single object of kind, failing the test otherwise.
func one[T any](t testing.TB, objs []*unstructured.Unstructured, kind string) *T {
	t.Helper()
	of := only(objs, kind)
	if len(of) != 1 {
		t.Fatalf("want exactly one %s, got %d", kind, len(of))
	}
	data, err := json.Marshal(of[0].Object)
	if err != nil {
		t.Fatal(err)
	}
	v := new(T)
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s %s: %v", kind, of[0].GetName(), err)
	}
	return v
}

// applier applies objects with server-side apply through the dynamic client,
// mapping kinds to resources by discovery.
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(t testing.TB, cfg *rest.Config) *applier {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cfg)
	return &applier{
		dyn:    dynamic.NewForConfigOrDie(cfg),
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery())),
	}
}

// apply server-side applies obj, as a dry run (dryRun=All) when dryRun is
// set, and returns what the API server answered.
func (a *applier) apply(ctx context.Context, obj *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, err
	}
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: ptr.To(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	return ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
}

// createNamespaces creates the Namespace objects of objs for real (a dry
// run creates nothing, and the namespaced objects need their namespace).
func createNamespaces(ctx context.Context, t testing.TB, cs kubernetes.Interface, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range only(objs, "Namespace") {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.GetName()}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", o.GetName(), err)
		}
	}
}

var rbacKinds = map[string]bool{"ServiceAccount": true, "Role": true, "RoleBinding": true, "ClusterRole": true, "ClusterRoleBinding": true}

// images are the examples' images, built once per test process (one go
// build for all of them, image.BuildAll, as make image runs it) in the
// background, so that a test can start a kube-apiserver meanwhile.
var images struct {
	once   sync.Once
	done   chan struct{} // closed when byName or err is set
	byName map[string]*unpacked
	err    error
}

// unpacked is an image written as an OCI layout and unpacked into root.
type unpacked struct {
	layout     string
	root       string
	entrypoint []string
	user       string
}

// startImages starts building the images of every example if no test of
// this process has yet; exampleImage waits for them.
func startImages(t testing.TB) {
	t.Helper()
	dir, root := filepath.Join(proctest.Dir(t), "images"), repoRoot(t)
	images.once.Do(func() {
		images.done = make(chan struct{})
		go func() {
			defer close(images.done)
			images.byName, images.err = buildImages(dir, root)
		}()
	})
}

// buildImages builds every example's image with package image (what make
// image runs), writes each as an OCI layout under dir/<name>, reads it back
// from there and unpacks its layers into a root directory beside it.
func buildImages(dir, repoRoot string) (map[string]*unpacked, error) {
	imgs, err := image.BuildAll(context.Background(), image.Examples, image.Options{RepoRoot: repoRoot})
	if err != nil {
		return nil, err
	}
	out := make(map[string]*unpacked, len(imgs))
	for i, e := range image.Examples {
		layoutDir, root := filepath.Join(dir, e.Name, "layout"), filepath.Join(dir, e.Name, "root")
		if err := image.WriteLayout(layoutDir, imgs[i], "test"); err != nil {
			return nil, err
		}
		read, err := image.ReadLayout(layoutDir)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, err
		}
		cfg, err := image.Unpack(read, root)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", e.Name, err)
		}
		u := &unpacked{layout: layoutDir, root: root, entrypoint: cfg.Config.Entrypoint, user: cfg.Config.User}
		if len(u.entrypoint) == 0 || !strings.HasPrefix(u.entrypoint[0], "/") {
			return nil, fmt.Errorf("image %s: entrypoint %q is not an absolute path", e.Name, u.entrypoint)
		}
		out[e.Name] = u
	}
	return out, nil
}

// exampleImage returns the unpacked image of the example named name,
// building the images first if no test has started that.
func exampleImage(t testing.TB, name string) *unpacked {
	t.Helper()
	startImages(t)
	<-images.done
	if images.err != nil {
		t.Fatal(images.err)
	}
	u, ok := images.byName[name]
	if !ok {
		t.Fatalf("no example %q", name)
	}
	return u
}

// bin returns the path of the image's entrypoint under its unpacked root.
func (u *unpacked) bin() string { return filepath.Join(u.root, filepath.FromSlash(u.entrypoint[0])) }

var apiServicesGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

func unstructuredString(obj map[string]any, path ...string) (string, bool, error) {
	return unstructured.NestedString(obj, path...)
}
