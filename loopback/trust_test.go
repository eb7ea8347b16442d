package loopback_test

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/loopback"
)

// get does GET /healthz through hc and returns the status code.
func get(t *testing.T, hc *http.Client, host string) (int, http.Header, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+"/healthz", nil)
	require.NoError(t, err)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header, nil
}

func isUnknownAuthority(err error) bool {
	var ua x509.UnknownAuthorityError
	return errors.As(err, &ua)
}

// TestTrustFollowsRotation rotates leaf and CA many times on a fake clock
// and checks that configurations derived once, before any rotation, keep
// verifying the server against the current bundle.
func TestTrustFollowsRotation(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now())
	c, err := loopback.NewCertificate(loopback.CertificateConfig{Clock: fc})
	require.NoError(t, err)
	const token = "secret-token"
	srv := tlsServer(t, c, token)

	base, err := c.RestConfig(srv.Listener.Addr().String(), token)
	require.NoError(t, err)

	type client struct {
		name   string
		hc     *http.Client
		serial func() string
		want   int // expected status
		ua     string
	}
	var clients []client
	add := func(name string, cfg *rest.Config, want int, ua string) {
		serial := tlstest.RecordServedSerials(cfg)
		hc, err := rest.HTTPClientFor(cfg)
		require.NoError(t, err, name)
		clients = append(clients, client{name: name, hc: hc, want: want, ua: ua, serial: func() string {
			if s := serial.Load(); s != nil {
				return s.Text(16)
			}
			return ""
		}})
	}
	add("base", rest.CopyConfig(base), http.StatusOK, "")
	withUA := rest.CopyConfig(base)
	withUA.UserAgent, withUA.QPS, withUA.Burst, withUA.Timeout = "custom-agent/1", 50, 100, 30*time.Second
	add("copy-with-useragent-qps", withUA, http.StatusOK, "custom-agent/1")
	add("loopback-anonymous", c.AnonymousClientConfig(base), http.StatusUnauthorized, "")

	// A clientset built once, used after every rotation.
	csCfg := rest.CopyConfig(base)
	csSerial := tlstest.RecordServedSerials(csCfg)
	cs, err := kubernetes.NewForConfig(csCfg)
	require.NoError(t, err)

	// rest.AnonymousClientConfig drops WrapTransport: it verifies against
	// the CAData snapshot, like upstream, until the served leaf is signed by
	// a CA the snapshot does not hold; then it fails closed.
	anon := rest.AnonymousClientConfig(base)
	assert.Empty(t, anon.BearerToken, "AnonymousClientConfig drops the token")
	assert.Nil(t, anon.WrapTransport)
	anonHC, err := rest.HTTPClientFor(anon)
	require.NoError(t, err)
	snapshot := x509.NewCertPool()
	require.True(t, snapshot.AppendCertsFromPEM(anon.CAData))
	code, _, err := get(t, anonHC, base.Host)
	require.NoError(t, err, "anonymous derivation verifies TLS against the snapshot")
	assert.Equal(t, http.StatusUnauthorized, code, "and carries no token")

	ctx := context.Background()
	cas := map[string]bool{}
	serials := map[string]bool{}
	anonFailedAt := -1
	const rotations = 40
	for i := 0; i < rotations; i++ {
		old := c.Leaf().SerialNumber.Text(16)
		fc.SetTime(c.RenewAt().Add(time.Millisecond))
		require.NoError(t, c.RunOnce(ctx))
		leaf := c.Leaf()
		serial := leaf.SerialNumber.Text(16)
		require.NotEqual(t, old, serial, "rotation %d changed the leaf", i)
		require.False(t, serials[serial])
		serials[serial] = true
		cas[hex.EncodeToString(leaf.AuthorityKeyId)] = true

		for _, cl := range clients {
			code, hdr, err := get(t, cl.hc, base.Host)
			require.NoError(t, err, "rotation %d, client %s", i, cl.name)
			assert.Equal(t, cl.want, code, "rotation %d, client %s", i, cl.name)
			assert.Equal(t, "HTTP/2.0", hdr.Get("X-Proto"), cl.name)
			if cl.ua != "" {
				assert.Equal(t, cl.ua, hdr.Get("X-User-Agent"))
			}
			assert.Equal(t, serial, cl.serial(), "rotation %d, client %s verified the new leaf", i, cl.name)
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/healthz").DoRaw(ctx)
		require.NoError(t, err, "rotation %d, clientset", i)
		assert.Equal(t, "ok", string(body))
		assert.Equal(t, serial, csSerial.Load().Text(16))

		// What the snapshot-only anonymous client would make of the new
		// leaf at this (fake) time; client-go itself verifies on the real
		// clock, so it is asked only before the clock moves (above).
		_, err = leaf.Verify(x509.VerifyOptions{Roots: snapshot, DNSName: loopback.ServerName, CurrentTime: fc.Now()})
		switch {
		case err == nil:
			require.Equal(t, -1, anonFailedAt, "once failed, the snapshot never verifies again")
		case isUnknownAuthority(err):
			if anonFailedAt < 0 {
				anonFailedAt = i
			}
		default:
			t.Fatalf("rotation %d: snapshot verification: unexpected error %v", i, err)
		}
	}
	assert.GreaterOrEqual(t, len(cas), 5, "CA rotations happened")
	assert.Positive(t, anonFailedAt, "the CAData snapshot outlived at least one rotation, then failed closed")
	t.Logf("%d leaf rotations, %d CAs; rest.AnonymousClientConfig snapshot failed closed from rotation %d", rotations, len(cas), anonFailedAt)
}

func TestTrustFailsClosed(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now())
	c, err := loopback.NewCertificate(loopback.CertificateConfig{Clock: fc})
	require.NoError(t, err)
	fc.Step(time.Second)
	other, err := loopback.NewCertificate(loopback.CertificateConfig{Clock: fc})
	require.NoError(t, err)

	t.Run("other CA", func(t *testing.T) {
		srv := tlsServer(t, other, "t")
		cfg, err := c.RestConfig(srv.Listener.Addr().String(), "t")
		require.NoError(t, err)
		hc, err := rest.HTTPClientFor(cfg)
		require.NoError(t, err)
		_, _, err = get(t, hc, cfg.Host)
		require.Error(t, err)
		assert.True(t, isUnknownAuthority(err), "got %v", err)
		// CAs made a second apart have different names, and the error
		// says which CA the server used and which the client trusts.
		ours, theirs := c.Leaf().Issuer.CommonName, other.Leaf().Issuer.CommonName
		assert.Equal(t, fmt.Sprintf("%s-ca@%d", loopback.ProviderName, fc.Now().Unix()), theirs)
		assert.NotEqual(t, ours, theirs)
		assert.ErrorContains(t, err, fmt.Sprintf(`issued by %q, which is not in the loopback trust bundle ["%s"]`, theirs, ours))
	})

	t.Run("expired on the injected clock", func(t *testing.T) {
		srv := tlsServer(t, c, "t")
		cfg, err := c.RestConfig(srv.Listener.Addr().String(), "t")
		require.NoError(t, err)
		hc, err := rest.HTTPClientFor(cfg)
		require.NoError(t, err)
		code, _, err := get(t, hc, cfg.Host)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)

		// No RunOnce: the served leaf is past NotAfter on the fake clock.
		fc.SetTime(c.Leaf().NotAfter.Add(time.Second))
		utilnet.CloseIdleConnectionsFor(hc.Transport)
		_, _, err = get(t, hc, cfg.Host)
		var inv x509.CertificateInvalidError
		require.ErrorAs(t, err, &inv)
		assert.Equal(t, x509.Expired, inv.Reason)

		require.NoError(t, c.RunOnce(context.Background()))
		code, _, err = get(t, hc, cfg.Host)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, code)
	})
}
