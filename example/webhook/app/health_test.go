package app

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHealthEndpoints: the readiness checks (serving-certificate and
// cabundle-published) are on /readyz and /healthz, each also on its own
// path, and none of them is on /livez, which a restart-happy kubelet
// probes.
func TestHealthEndpoints(t *testing.T) {
	w, err := New(parse(t, "--ca-secret=ns/ca", "--kubeconfig="+unreachableKubeconfig(t), "--secure-port=0"))
	require.NoError(t, err)
	h := w.Handler()

	for _, path := range []string{"/readyz", "/healthz"} {
		code, body := get(t, h, path+"?verbose")
		assert.Equal(t, http.StatusInternalServerError, code, path)
		assert.Contains(t, body, "[-]serving-certificate failed", path)
		assert.Contains(t, body, "[-]cabundle-published failed", path)
		for _, check := range []string{"serving-certificate", "cabundle-published"} {
			code, _ = get(t, h, path+"/"+check)
			assert.Equal(t, http.StatusInternalServerError, code, path+"/"+check)
		}
	}
	code, body := get(t, h, "/livez?verbose")
	assert.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, "serving-certificate")
	assert.NotContains(t, body, "cabundle-published")
	for _, check := range []string{"serving-certificate", "cabundle-published"} {
		code, _ = get(t, h, "/livez/"+check)
		assert.Equal(t, http.StatusNotFound, code, "/livez/"+check)
	}
}
