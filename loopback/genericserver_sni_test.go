package loopback_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/loopback"
)

func servedLeaf(t *testing.T, addr, serverName string) *x509.Certificate {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: serverName, InsecureSkipVerify: true}) // test-only: inspect what is served
	require.NoError(t, err)
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// TestGenericAPIServer checks, in a real genericapiserver, that ApplyTo keeps
// upstream's behaviour: the loopback certificate is served for its SNI name
// only, and the loopback config authenticates and verifies.
func TestGenericAPIServer(t *testing.T) {
	s := startGenericServer(t, false)
	require.NotNil(t, s.cert)

	assert.Equal(t, s.cert.Leaf().SerialNumber, servedLeaf(t, s.addr, loopback.ServerName).SerialNumber)
	for _, name := range []string{"", "localhost", "example.test"} {
		assert.Equal(t, s.serving.Leaf().SerialNumber, servedLeaf(t, s.addr, name).SerialNumber, "SNI %q", name)
	}
	_, err := tlstest.Handshake(s.addr, &tls.Config{ServerName: "localhost", RootCAs: tlstest.Pool(t, s.cert.CurrentCABundleContent())})
	assert.Error(t, err, "the loopback CA does not vouch for other names")

	cs, err := kubernetes.NewForConfig(s.loopback)
	require.NoError(t, err)
	_, err = cs.Discovery().ServerVersion()
	require.NoError(t, err)

	anon, err := kubernetes.NewForConfig(rest.AnonymousClientConfig(s.loopback))
	require.NoError(t, err)
	_, err = anon.Discovery().ServerVersion()
	require.Error(t, err)
	assert.True(t, apierrors.IsUnauthorized(err), "TLS verified, no credentials: %v", err)
}
