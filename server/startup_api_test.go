package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// kubeconfigFor writes a kubeconfig for the API server at host, trusting
// any serving certificate (the test servers' are made up).
func kubeconfigFor(t *testing.T, host string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, host)), 0o600))
	return path
}

// closedPort returns 127.0.0.1:<port> where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// serveStepping runs s.Serve and steps clk by a second whenever start-up
// waits on it beyond the --startup-timeout timer (a backoff timer is
// waiting too), until Serve returns or, when until is not nil, until is
// closed. It returns a function that stops Serve and returns its error
// then, and Serve's error (nil when until closed first).
func serveStepping(t *testing.T, s *Serving, clk *clocktesting.FakeClock, until <-chan struct{}) (func() error, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, http.NotFoundHandler()) }()
	stop := func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(serveGuard):
			t.Fatalf("Serve did not return within %v of its context ending", serveGuard)
			return nil
		}
	}
	guard := time.After(serveGuard)
	for {
		select {
		case err := <-done:
			cancel()
			done <- err
			return stop, err
		case <-until:
			return stop, nil
		case <-guard:
			_ = stop()
			t.Fatalf("Serve neither returned nor listened within %v of real time", serveGuard)
		case <-time.After(time.Millisecond):
			if clk.Waiters() >= 2 {
				clk.Step(time.Second)
			}
		}
	}
}

// TestServeAPIServerUnreachableAtStart: with --tls-secret or --ca-secret
// and nothing listening at the kubeconfig's server, Serve retries with
// backoff until --startup-timeout has passed on its clock, then returns an
// error naming the flag, the timeout and the cause (the connection
// refused), and opens no listener. Before, it returned at once with
// "no serving certificate: default certificate from provider ...: nothing
// loaded yet", after logging "Initial load failed; will keep retrying".
func TestServeAPIServerUnreachableAtStart(t *testing.T) {
	for _, flag := range []string{"--tls-secret", "--ca-secret"} {
		t.Run(flag, func(t *testing.T) {
			o, err := parse(t, flag+"=ns/serving", "--kubeconfig="+kubeconfigFor(t, "https://"+closedPort(t)), "--startup-timeout=1m", "--secure-port=0")
			require.NoError(t, err)
			clk := clocktesting.NewFakeClock(time.Now())
			o.Clock = clk
			start := clk.Now()
			s, err := o.Build()
			require.NoError(t, err)
			_, err = serveStepping(t, s, clk, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), flag+" ns/serving: not loaded within --startup-timeout (1m0s): ")
			assert.Contains(t, err.Error(), "connection refused")
			assert.GreaterOrEqual(t, clk.Since(start), time.Minute, "gave up before --startup-timeout")
			assert.Nil(t, s.Addr(), "no listener was opened")
		})
	}
}

// TestServeWaitsForAPIServerAtStart: the API server does not answer when
// Serve starts (nothing listens on its port) and comes up on that port
// while Serve backs off: Serve then loads --tls-secret and serves its
// certificate. Before, Serve had returned "nothing loaded yet" at the
// first refusal.
func TestServeWaitsForAPIServerAtStart(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "ca", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "serving.test", DNSNames: []string{"serving.test"}, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	secret := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "serving", ResourceVersion: "1"},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM},
	}
	var gets atomic.Int32
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/api/v1/namespaces/ns/secrets/serving":
			gets.Add(1)
			_ = json.NewEncoder(w).Encode(secret)
		case r.URL.Path == "/api/v1/namespaces/ns/secrets" && r.URL.Query().Get("watch") != "true":
			_ = json.NewEncoder(w).Encode(&corev1.SecretList{
				TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "SecretList"},
				ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: []corev1.Secret{*secret},
			})
		case r.URL.Path == "/api/v1/namespaces/ns/secrets":
			// A watch with nothing to say: open until the client leaves.
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			http.NotFound(w, r)
		}
	}))
	addr := closedPort(t)
	o, err := parse(t, "--tls-secret=ns/serving", "--kubeconfig="+kubeconfigFor(t, "https://"+addr), "--startup-timeout=1h", "--secure-port=0")
	require.NoError(t, err)
	clk := clocktesting.NewFakeClock(now)
	o.Clock = clk
	s, err := o.Build()
	require.NoError(t, err)

	// Up once the first attempt was refused and Serve backs off.
	go func() {
		for clk.Waiters() < 2 {
			time.Sleep(time.Millisecond)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("listening on %s again: %v", addr, err)
			return
		}
		api.Listener = ln
		api.StartTLS()
	}()
	stop, err := serveStepping(t, s, clk, s.Listening())
	require.NoError(t, err, "Serve returned before listening")
	t.Cleanup(api.Close)
	defer func() { require.NoError(t, stop()) }()
	assert.Positive(t, gets.Load(), "the Secret was read once the API server was up")
	served, err := tlstest.Dial(s.Addr().String(), &tls.Config{ServerName: "serving.test", RootCAs: tlstest.Pool(t, ca.CertPEM), Time: clk.Now})
	require.NoError(t, err)
	assert.Equal(t, leaf.Cert.SerialNumber, served.SerialNumber, "the certificate of the Secret is served")
}
