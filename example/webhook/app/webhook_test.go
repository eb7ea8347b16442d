package app

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// unreachableKubeconfig writes a kubeconfig for an API server that does not
// exist; New builds clients from it but talks to nobody until Run.
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "t"}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	return w.Code, w.Body.String()
}

func TestNewRoutes(t *testing.T) {
	_, err := New(parse(t))
	require.ErrorContains(t, err, "--ca-secret: required")

	w, err := New(parse(t, "--ca-secret=ns/ca", "--kubeconfig="+unreachableKubeconfig(t), "--secure-port=0"))
	require.NoError(t, err)
	h := w.Handler()

	// Not ready: nothing is loaded or published yet; readyz says why.
	code, body := get(t, h, "/readyz?verbose")
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.Contains(t, body, "[-]cabundle-published failed")
	assert.Contains(t, body, "[-]serving-certificate failed")
	code, _ = get(t, h, "/readyz/cabundle-published")
	assert.Equal(t, http.StatusInternalServerError, code)
	// Liveness does not wait for publishing.
	_, body = get(t, h, "/livez?verbose")
	assert.NotContains(t, body, "cabundle-published")
	code, _ = get(t, h, "/metrics")
	assert.Equal(t, http.StatusOK, code)

	code, out, body := post(t, atPath(h, ValidatePath), "application/json", review(request(admissionv1.Create, configMapJSON(t, nil, nil))))
	require.Equal(t, http.StatusOK, code, body)
	assert.False(t, out.Response.Allowed)
	code, out, body = post(t, atPath(h, MutatePath), "application/json", review(request(admissionv1.Create, configMapJSON(t, nil, nil))))
	require.Equal(t, http.StatusOK, code, body)
	assert.NotEmpty(t, out.Response.Patch)

	code, _ = get(t, h, ValidatePath)
	assert.Equal(t, http.StatusMethodNotAllowed, code)
}

// atPath returns a handler that sends every request to path on h.
func atPath(h http.Handler, path string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.URL.Path = path
		h.ServeHTTP(w, r)
	})
}

// TestRBACManifest checks that rbac.yaml decodes and grants what the
// webhook uses.
func TestRBACManifest(t *testing.T) {
	f, err := os.Open("../rbac.yaml")
	require.NoError(t, err)
	defer f.Close()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	verbs := map[string]sets.Set[string]{}
	kinds := map[string]int{}
	for {
		doc, err := reader.Read()
		if err != nil {
			break
		}
		if strings.TrimSpace(string(doc)) == "" {
			continue
		}
		obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		require.NoError(t, err)
		kinds[gvk.Kind]++
		var rules []rbacv1.PolicyRule
		switch o := obj.(type) {
		case *rbacv1.Role:
			rules = o.Rules
		case *rbacv1.ClusterRole:
			rules = o.Rules
		}
		for _, r := range rules {
			for _, res := range r.Resources {
				if verbs[res] == nil {
					verbs[res] = sets.New[string]()
				}
				verbs[res].Insert(r.Verbs...)
			}
		}
	}
	assert.Equal(t, map[string]int{"Role": 1, "RoleBinding": 1, "ClusterRole": 3, "ClusterRoleBinding": 3}, kinds)
	// --ca-from-signer reads the signer's ClusterTrustBundles; the
	// publisher sends Events.
	assert.Equal(t, sets.New("get", "list", "watch"), verbs["clustertrustbundles"])
	assert.Equal(t, sets.New("create", "patch"), verbs["events"])
	assert.Equal(t, sets.New("get", "list", "watch", "update", "create"), verbs["secrets"])
	for _, res := range []string{"validatingwebhookconfigurations", "mutatingwebhookconfigurations"} {
		assert.Equal(t, sets.New("get", "list", "watch", "patch", "update", "create"), verbs[res], res)
	}
}
