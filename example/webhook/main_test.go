package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/evercert/evercert/internal/proctest"
)

// runToExit runs bin with args until it exits (internal/proctest).
// TestMain removes the binaries the tests build (proctest.Build).
func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }

func runToExit(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	return proctest.RunToExit(t, exec.Command(bin, args...))
}

// fakeSecretAPI is just enough of a kube-apiserver for the webhook's
// start-up: it stores the CA Secret ns/ca (GET, POST, PUT) and answers
// everything else (the caBundle publisher's calls) with 404. What comes
// after start-up is covered by the e2e tier against a real kube-apiserver.
type fakeSecretAPI struct {
	mu     sync.Mutex
	secret *corev1.Secret
	rv     int
}

func (f *fakeSecretAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	const collection, item = "/api/v1/namespaces/ns/secrets", "/api/v1/namespaces/ns/secrets/ca"
	switch {
	case r.Method == http.MethodGet && r.URL.Path == item && f.secret != nil:
		f.reply(w, http.StatusOK, f.secret)
	case r.Method == http.MethodPost && r.URL.Path == collection, r.Method == http.MethodPut && r.URL.Path == item:
		body, err := io.ReadAll(r.Body)
		if err != nil {
			f.reply(w, http.StatusBadRequest, &apierrors.NewBadRequest(err.Error()).ErrStatus)
			return
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		s, ok := obj.(*corev1.Secret)
		if err != nil || !ok {
			f.reply(w, http.StatusBadRequest, &apierrors.NewBadRequest("not a Secret").ErrStatus)
			return
		}
		f.rv++
		s.ResourceVersion = strconv.Itoa(f.rv)
		f.secret = s
		code := http.StatusOK
		if r.Method == http.MethodPost {
			code = http.StatusCreated
		}
		f.reply(w, code, s)
	default:
		f.reply(w, http.StatusNotFound, &apierrors.NewNotFound(schema.GroupResource{Resource: r.URL.Path}, "").ErrStatus)
	}
}

func (f *fakeSecretAPI) reply(w http.ResponseWriter, code int, obj runtime.Object) {
	data, err := runtime.Encode(scheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), obj)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(data)
}

func kubeconfigFor(t *testing.T, server string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: server}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "t"}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// TestWebhookPortInUseExits starts the webhook binary against a fake API
// server that lets it create its CA, so it gets as far as listening, on a
// port that is in use: it exits non-zero, naming the address.
func TestWebhookPortInUseExits(t *testing.T) {
	api := &fakeSecretAPI{}
	apiServer := httptest.NewServer(api)
	defer apiServer.Close()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	port := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)

	code, out := runToExit(t, proctest.Build(t, "github.com/evercert/evercert/example/webhook"),
		"--kubeconfig="+kubeconfigFor(t, apiServer.URL), "--ca-secret=ns/ca", "--self-signed-hosts=127.0.0.1", "--secure-port="+port)
	t.Logf("webhook output:\n%s", out)
	api.mu.Lock()
	created := api.secret != nil
	api.mu.Unlock()
	require.True(t, created, "the webhook created its CA Secret, so it got as far as listening; output:\n%s", out)
	assert.NotZero(t, code, out)
	assert.Contains(t, out, "127.0.0.1:"+port, "the error names the address")
	assert.Contains(t, out, "address already in use")
}

// TestWebhookHTTP2IncompatibleSuitesExit: a suite list HTTP/2 cannot use is
// refused at start, naming the flag, before any API call.
func TestWebhookHTTP2IncompatibleSuitesExit(t *testing.T) {
	api := &fakeSecretAPI{}
	apiServer := httptest.NewServer(api)
	defer apiServer.Close()

	code, out := runToExit(t, proctest.Build(t, "github.com/evercert/evercert/example/webhook"),
		"--kubeconfig="+kubeconfigFor(t, apiServer.URL), "--ca-secret=ns/ca", "--self-signed-hosts=127.0.0.1", "--secure-port=0",
		"--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA")
	assert.NotZero(t, code, out)
	assert.Contains(t, out, "--tls-cipher-suites")
	assert.Contains(t, out, "HTTP/2")
	assert.NotContains(t, out, "serving on https://", "no listener was opened")
}
