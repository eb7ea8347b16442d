package loopback

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestTrustPoolCachedByContent(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now())
	c, err := NewCertificate(CertificateConfig{Clock: fc})
	require.NoError(t, err)

	p1, err := c.trust.pool()
	require.NoError(t, err)
	p2, err := c.trust.pool()
	require.NoError(t, err)
	assert.Same(t, p1, p2, "an unchanged bundle is not parsed again")

	// Step to the CA renewal: a successor CA joins the bundle.
	before := c.CurrentCABundleContent()
	for i := 0; i < 10 && string(before) == string(c.CurrentCABundleContent()); i++ {
		fc.SetTime(c.RenewAt().Add(time.Millisecond))
		require.NoError(t, c.RunOnce(context.Background()))
	}
	require.NotEqual(t, before, c.CurrentCABundleContent())
	p3, err := c.trust.pool()
	require.NoError(t, err)
	assert.NotSame(t, p1, p3)

	cfg, err := c.trust.tlsConfig([]string{"h2"})
	require.NoError(t, err)
	assert.False(t, cfg.InsecureSkipVerify, "verification is never skipped")
	assert.Equal(t, ServerName, cfg.ServerName)
	assert.Equal(t, fc.Now(), cfg.Time())
	assert.Nil(t, c.transport.TLSClientConfig.RootCAs)
	assert.False(t, c.transport.TLSClientConfig.InsecureSkipVerify)
}

func TestRunIsExclusive(t *testing.T) {
	c, err := NewCertificate(CertificateConfig{})
	require.NoError(t, err)
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1 := make(chan struct{})
	go func() { c.Run(ctx1, 1); close(done1) }()

	// Wait until the first Run holds the semaphore.
	require.Eventually(t, func() bool { return len(c.runSem) == 1 }, 5*time.Second, time.Millisecond)

	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan struct{})
	go func() { c.Run(ctx2, 1); close(done2) }()
	cancel2()
	select {
	case <-done2:
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting Run did not return when its context ended")
	}
	cancel1()
	select {
	case <-done1:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return when its context ended")
	}
	assert.Empty(t, c.runSem)
}

type fakeRT struct{ calls int }

func (f *fakeRT) RoundTrip(*http.Request) (*http.Response, error) {
	f.calls++
	return &http.Response{StatusCode: http.StatusSwitchingProtocols, Body: http.NoBody}, nil
}

func TestUpgradeRequestsUseStaticTransport(t *testing.T) {
	c, err := NewCertificate(CertificateConfig{})
	require.NoError(t, err)
	static := &fakeRT{}
	rt := c.WrapTransport(static)

	req, err := http.NewRequest(http.MethodPost, "https://127.0.0.1:1/api/v1/namespaces/x/pods/y/exec", nil)
	require.NoError(t, err)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "SPDY/3.1")
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 1, static.calls, "upgrade requests go to client-go's own round tripper")

	assert.Same(t, c.transport, rt.(interface{ WrappedRoundTripper() http.RoundTripper }).WrappedRoundTripper())
}
