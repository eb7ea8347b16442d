package server

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/healthz"
)

// TestInstallHandlersWithChecks: liveness checks are on every health
// endpoint; readiness checks and serving-certificate are on /readyz and
// /healthz only.
func TestInstallHandlersWithChecks(t *testing.T) {
	s, err := NewOptions().Build()
	require.NoError(t, err)
	mux := http.NewServeMux()
	s.InstallHandlersWithChecks(mux, HealthChecks{
		Liveness:  []healthz.HealthChecker{healthz.NamedCheck("live-check", func(*http.Request) error { return nil })},
		Readiness: []healthz.HealthChecker{healthz.NamedCheck("ready-check", func(*http.Request) error { return errors.New("not yet") })},
	})
	get := func(path string) (int, string) {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Code, w.Body.String()
	}

	code, body := get("/livez?verbose")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "[+]live-check ok")
	assert.NotContains(t, body, "ready-check")
	assert.NotContains(t, body, ServingCertificateCheckName)
	for _, path := range []string{"/readyz", "/healthz"} {
		code, body := get(path + "?verbose")
		assert.Equal(t, http.StatusInternalServerError, code, path)
		assert.Contains(t, body, "[+]live-check ok", path)
		assert.Contains(t, body, "[-]ready-check failed", path)
		// Not run yet: nothing is loaded.
		assert.Contains(t, body, "[-]serving-certificate failed", path)
	}
	code, _ = get("/livez/ready-check")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = get("/readyz/ready-check")
	assert.Equal(t, http.StatusInternalServerError, code)
	code, _ = get("/metrics")
	assert.Equal(t, http.StatusOK, code)
}
