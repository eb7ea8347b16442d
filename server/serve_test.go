package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// running is a Serve call in the background.
type running struct {
	serving *Serving
	addr    string
	cancel  context.CancelFunc
	done    chan error
}

func start(t *testing.T, o *Options, handler http.Handler) *running {
	t.Helper()
	return startWithContext(t, context.Background(), o, handler)
}

// startWithContext is start with Serve's parent context, for a test that
// gives the server a logger (klog.NewContext).
func startWithContext(t *testing.T, parent context.Context, o *Options, handler http.Handler) *running {
	t.Helper()
	o.SecurePort = 0
	s, err := o.Build()
	require.NoError(t, err)
	mux := http.NewServeMux()
	s.InstallHandlers(mux)
	if handler != nil {
		mux.Handle("/", handler)
	}
	ctx, cancel := context.WithCancel(parent)
	r := &running{serving: s, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Serve(ctx, mux) }()
	select {
	case <-s.Listening():
	case err := <-r.done:
		t.Fatalf("Serve returned before listening: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not start listening")
	}
	r.addr = s.Addr().String()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *running) stop(t *testing.T) {
	r.cancel()
	select {
	case err := <-r.done:
		assert.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Error("Serve did not return after its context ended")
	}
	r.done <- nil // later stop calls return at once
}

func client(pool *x509.CertPool, now func() time.Time) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: "localhost", Time: now},
		ForceAttemptHTTP2: true,
	}}
}

func get(t *testing.T, c *http.Client, url string) (int, string, *http.Response) {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body), resp
}

func TestServeSelfSignedDefault(t *testing.T) {
	o := NewOptions()
	o.CABundleFile = filepath.Join(t.TempDir(), "ca.crt")
	r := start(t, o, nil)

	bundle, err := os.ReadFile(o.CABundleFile)
	require.NoError(t, err)
	info, err := os.Stat(o.CABundleFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), info.Mode().Perm())

	c := client(tlstest.Pool(t, bundle), nil)
	for _, path := range []string{"/healthz", "/livez", "/readyz"} {
		code, body, resp := get(t, c, "https://"+r.addr+path+"?verbose")
		assert.Equal(t, http.StatusOK, code, path)
		if path != "/livez" { // a readiness check: see TestServingCertificateCheckNotOnLivez
			assert.Contains(t, body, "[+]serving-certificate ok", path)
		}
		assert.Equal(t, 2, resp.ProtoMajor, "HTTP/2 is negotiated")
	}
	_, metrics, _ := get(t, c, "https://"+r.addr+"/metrics")
	assert.Contains(t, metrics, `evercert_certificate_expiration_timestamp_seconds{provider="self-signed"}`)
	assert.Contains(t, metrics, `evercert_certificate_rotations_total{provider="self-signed"}`)
	assert.Contains(t, metrics, `evercert_certificate_load_errors_total{provider="self-signed"}`)
}

func TestServeTLSPosture(t *testing.T) {
	r := start(t, NewOptions(), nil)
	for _, v := range []uint16{tls.VersionTLS10, tls.VersionTLS11} {
		_, err := tlstest.Dial(r.addr, &tls.Config{InsecureSkipVerify: true, MinVersion: v, MaxVersion: v})
		assert.Error(t, err, "TLS version %x must be refused", v)
	}
	_, err := tlstest.Dial(r.addr, &tls.Config{
		InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12,
		CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256},
	})
	assert.Error(t, err, "non-AEAD suites are not offered by default")
	_, err = tlstest.Dial(r.addr, &tls.Config{
		InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12,
		CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
	})
	assert.NoError(t, err)
}

// TestServeRotationRewritesBundle drives the self-signed default on a fake
// clock through CA rotations; the bundle file follows, and a client that
// reloads it before each request keeps working.
func TestServeRotationRewritesBundle(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	o := NewOptions()
	o.Clock = clk
	o.SelfSignedValidity = time.Hour
	o.CABundleFile = filepath.Join(t.TempDir(), "ca.crt")
	r := start(t, o, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	before := certmetricstest.Rotations(t, "self-signed")

	bundles := map[string]bool{}
	for step := range 40 {
		clk.Step(10 * time.Minute)
		// The provider's own loop renews on its timer; wait until it has
		// (its leaf is no longer due: more than the default renew-before, a
		// third of the validity, left) and the controller serves what it
		// holds now. Both are re-read at every poll: a successor CA signs a
		// new leaf as soon as the bundle file has it.
		require.Eventually(t, func() bool {
			want, _ := r.serving.Serving.CurrentCertKeyContent()
			leaf := pemCert(t, want)
			if leaf.NotAfter.Sub(clk.Now()) <= o.SelfSignedValidity/3 {
				return false
			}
			for _, sc := range r.serving.Controller.Served() {
				if sc.IsDefault {
					return sc.Serial == leaf.SerialNumber.Text(16)
				}
			}
			return false
		}, 5*time.Second, time.Millisecond, "step %d", step)
		var bundle []byte
		require.Eventually(t, func() bool {
			var err error
			bundle, err = os.ReadFile(o.CABundleFile)
			return err == nil && string(bundle) == string(r.serving.TrustBundle.CurrentCABundleContent())
		}, 5*time.Second, time.Millisecond, "bundle file follows rotation at step %d", step)
		bundles[string(bundle)] = true
		code, body, _ := get(t, client(tlstest.Pool(t, bundle), clk.Now), "https://"+r.addr+"/")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "ok", body)
	}
	assert.Greater(t, len(bundles), 3, "the bundle file was rewritten at CA rotations")
	assert.Greater(t, certmetricstest.Rotations(t, "self-signed")-before, 5.0)
}

func pemCert(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	certs, err := pki.ParseCABundle(certPEM)
	require.NoError(t, err)
	return certs[0]
}

func TestServeFilesSNIAndClientCA(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "test-ca", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	issue := func(names ...string) *pki.Issued {
		leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: names[0], DNSNames: names, Now: now, Lifetime: time.Hour})
		require.NoError(t, err)
		return leaf
	}
	def, alt := issue("localhost"), issue("alt.test")
	clientCA, err := pki.NewCA(pki.Request{CommonName: "client-ca", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	clientLeaf, err := pki.IssueLeaf(clientCA, pki.Request{CommonName: "alice", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)

	o := NewOptions()
	o.CertFile, o.KeyFile = write("tls.crt", def.CertPEM), write("tls.key", def.KeyPEM)
	_, err = parseInto(o, "--tls-sni-cert-key="+write("alt.crt", alt.CertPEM)+","+write("alt.key", alt.KeyPEM))
	require.NoError(t, err)
	o.ClientCAFile = write("client-ca.crt", clientCA.CertPEM)
	r := start(t, o, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if len(req.TLS.PeerCertificates) > 0 {
			_, _ = io.WriteString(w, req.TLS.PeerCertificates[0].Subject.CommonName)
		}
	}))

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	served, err := tlstest.Dial(r.addr, &tls.Config{RootCAs: pool, ServerName: "alt.test"})
	require.NoError(t, err)
	assert.Equal(t, alt.Cert.SerialNumber, served.SerialNumber)
	served, err = tlstest.Dial(r.addr, &tls.Config{RootCAs: pool, ServerName: "localhost"})
	require.NoError(t, err)
	assert.Equal(t, def.Cert.SerialNumber, served.SerialNumber)

	cert, err := tls.X509KeyPair(clientLeaf.CertPEM, clientLeaf.KeyPEM)
	require.NoError(t, err)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{cert},
	}}}
	_, body, _ := get(t, c, "https://"+r.addr+"/")
	assert.Equal(t, "alice", body, "client certificate verified against --client-ca-file")
}

func parseInto(o *Options, args ...string) (*Options, error) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	return o, fs.Parse(args)
}

// TestGracefulShutdown cancels Serve while a request is in flight: the
// request completes, new connections are refused, and Serve returns nil.
func TestGracefulShutdown(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	o := NewOptions()
	o.CABundleFile = filepath.Join(t.TempDir(), "ca.crt")
	r := start(t, o, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "finished")
	}))
	bundle, err := os.ReadFile(o.CABundleFile)
	require.NoError(t, err)
	c := client(tlstest.Pool(t, bundle), nil)

	var wg sync.WaitGroup
	var body string
	wg.Go(func() {
		resp, err := c.Get("https://" + r.addr + "/slow")
		if !assert.NoError(t, err) {
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
	})
	<-entered
	r.cancel()
	// Shutdown closes the listener first; give it a moment, then check that
	// new connections are refused while the old request is still running.
	require.Eventually(t, func() bool {
		_, err := tlstest.Dial(r.addr, &tls.Config{InsecureSkipVerify: true})
		return err != nil
	}, 5*time.Second, 10*time.Millisecond)
	close(release)
	wg.Wait()
	assert.Equal(t, "finished", body)
	select {
	case err := <-r.done:
		require.NoError(t, err)
		r.done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
}

func TestNoListenerWithoutCertificate(t *testing.T) {
	o := NewOptions()
	o.SecurePort = 0
	o.CertFile, o.KeyFile = filepath.Join(t.TempDir(), "missing.crt"), filepath.Join(t.TempDir(), "missing.key")
	s, err := o.Build()
	require.NoError(t, err)
	err = s.Serve(context.Background(), http.NotFoundHandler())
	require.ErrorContains(t, err, "no serving certificate")
	assert.Nil(t, s.Addr(), "no listener was opened")
}

// TestCABundleFileUnwritable fails at start, naming the flag, when the CA
// bundle file cannot be written, and opens no listener.
func TestCABundleFileUnwritable(t *testing.T) {
	o := NewOptions()
	o.SecurePort = 0
	o.CABundleFile = filepath.Join(t.TempDir(), "missing-dir", "ca.crt")
	s, err := o.Build()
	require.NoError(t, err)
	err = s.Serve(context.Background(), http.NotFoundHandler())
	require.ErrorContains(t, err, "--ca-bundle-file: writing CA bundle")
	assert.Nil(t, s.Addr(), "no listener was opened")
}
