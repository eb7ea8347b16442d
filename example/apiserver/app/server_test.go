package app_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/evercert/evercert/example/apiserver/app"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/loopback"
)

type whoami struct {
	Name   string   `json:"name"`
	Groups []string `json:"groups"`
}

// addWhoami serves /test/whoami, echoing the authenticated user.
func addWhoami(s *app.Server) {
	s.GenericAPIServer.Handler.NonGoRestfulMux.HandleFunc("/test/whoami", func(w http.ResponseWriter, r *http.Request) {
		u, ok := request.UserFrom(r.Context())
		if !ok {
			http.Error(w, "no user", http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(whoami{Name: u.GetName(), Groups: u.GetGroups()})
	})
}

func TestServerUpstreamBehaviour(t *testing.T) {
	s := startServer(t, nil, addWhoami)
	cfg := s.GenericAPIServer.LoopbackClientConfig
	require.NotNil(t, s.Serving, "no certificate files: in-memory self-signed serving certificate")
	ctx := context.Background()

	t.Run("loopback certificate is served for its SNI name only", func(t *testing.T) {
		leaf, err := handshake(s.Addr, loopback.ServerName, tlstest.Pool(t, s.Loopback.CurrentCABundleContent()), time.Now)
		require.NoError(t, err)
		assert.Equal(t, s.Loopback.Leaf().SerialNumber, leaf.SerialNumber)

		servingLeaf := s.Serving.Leaf()
		leaf, err = handshake(s.Addr, "localhost", tlstest.Pool(t, s.Serving.CurrentCABundleContent()), time.Now)
		require.NoError(t, err, "localhost gets the normal serving certificate")
		assert.Equal(t, servingLeaf.SerialNumber, leaf.SerialNumber)

		for _, name := range []string{"", "other.example"} {
			leaf, err = handshake(s.Addr, name, nil, nil)
			require.NoError(t, err)
			assert.Equal(t, servingLeaf.SerialNumber, leaf.SerialNumber, "SNI %q gets the default serving certificate", name)
			assert.NotContains(t, leaf.DNSNames, loopback.ServerName)
		}
	})

	t.Run("loopback token is system:apiserver in system:masters", func(t *testing.T) {
		hc, err := rest.HTTPClientFor(cfg)
		require.NoError(t, err)
		resp, err := hc.Get(cfg.Host + "/test/whoami")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var who whoami
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&who))
		assert.Equal(t, "system:apiserver", who.Name)
		assert.Contains(t, who.Groups, "system:masters")
		assert.Equal(t, 2, resp.ProtoMajor, "the loopback client speaks HTTP/2")
	})

	t.Run("anonymous derivations verify TLS but are not authorized", func(t *testing.T) {
		for name, anon := range map[string]*rest.Config{
			"rest.AnonymousClientConfig":           rest.AnonymousClientConfig(cfg),
			"(*Certificate).AnonymousClientConfig": s.Loopback.AnonymousClientConfig(cfg),
		} {
			assert.Empty(t, anon.BearerToken, name)
			cs, err := kubernetes.NewForConfig(anon)
			require.NoError(t, err)
			_, err = cs.Discovery().RESTClient().Get().AbsPath("/apis").DoRaw(ctx)
			require.Error(t, err, name)
			assert.True(t, apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err), "%s: want 401/403, got %v", name, err)
			var ua x509.UnknownAuthorityError
			assert.False(t, errors.As(err, &ua), name)
			// Public paths are readable anonymously, over verified TLS.
			_, err = cs.Discovery().ServerVersion()
			assert.NoError(t, err, name)
		}
	})

	t.Run("health checks", func(t *testing.T) {
		cs, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		get := func(path string) string {
			b, err := cs.Discovery().RESTClient().Get().AbsPath(path).Param("verbose", "true").DoRaw(ctx)
			require.NoError(t, err, path)
			return string(b)
		}
		assert.Contains(t, get("/healthz"), "[+]loopback-serving-certificate ok")
		assert.Contains(t, get("/livez"), "[+]loopback-serving-certificate ok")
		assert.NotContains(t, get("/readyz"), "loopback-serving-certificate")
		assert.Contains(t, get("/healthz"), "[+]poststarthook/"+loopback.PostStartHookName+" ok")
		metrics := get("/metrics")
		assert.Contains(t, metrics, `evercert_certificate_expiration_timestamp_seconds{provider="loopback"}`)
		for _, p := range []string{"/version", "/apis"} {
			_, err := cs.Discovery().RESTClient().Get().AbsPath(p).DoRaw(ctx)
			assert.NoError(t, err, p)
		}
	})
}

func TestServerFlags(t *testing.T) {
	o := app.NewOptions()
	assert.Equal(t, 8444, o.SecureServing.BindPort)
	assert.Equal(t, "127.0.0.1", o.SecureServing.BindAddress.String())
	assert.Equal(t, 24*time.Hour, o.LoopbackValidity)
	assert.Equal(t, 500*time.Millisecond, o.SelfcheckInterval)

	o.LoopbackValidity = 100 * time.Millisecond
	assert.Error(t, o.Validate())
	o.LoopbackValidity = time.Second
	o.SelfcheckInterval = -1
	assert.Error(t, o.Validate())
	o.SelfcheckInterval = 0
	assert.NoError(t, o.Validate())
	assert.True(t, strings.HasPrefix(o.SecureServing.BindAddress.String(), "127."))
}
