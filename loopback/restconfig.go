package loopback

import (
	"bytes"
	"fmt"
	"net"

	"github.com/google/uuid"
	"k8s.io/client-go/rest"
)

// HostPort returns the host and port a loopback client uses to reach a
// server listening on bindAddress ("HOST:PORT", e.g. a listener's Addr()).
// Unspecified addresses become the loopback address of the same family:
// 0.0.0.0 becomes 127.0.0.1 and :: becomes ::1. (Upstream looks for a
// loopback interface and falls back to "localhost", which resolvers may send
// elsewhere; the fixed loopback IPs never leave the machine.) Other hosts and
// the port are kept.
func HostPort(bindAddress string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(bindAddress)
	if err != nil {
		return "", "", fmt.Errorf("invalid server bind address %q: %w", bindAddress, err)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if ip.To4() != nil {
			host = "127.0.0.1"
		} else {
			host = "::1"
		}
	}
	return host, port, nil
}

// RestConfig returns a privileged loopback client configuration for a server
// listening on bindAddress (see HostPort), authenticating with token, or with
// a new random token (a UUID) when token is empty. Like upstream's
// SecureServingInfo.NewLoopbackClientConfig it sets Host to
// https://HOST:PORT, BearerToken, QPS -1 (no client-side rate limit) and
// TLSClientConfig.ServerName = ServerName. Unlike upstream, its trust
// follows rotation.
//
// How the trust works: WrapTransport is set to c.WrapTransport, which sends
// every request through the Certificate's own HTTP transport. That transport
// dials TLS itself and verifies every new connection with Go's standard
// verification against the CA bundle current at dial time (parsed once per
// bundle change), for ServerName, at the Certificate clock's time; it speaks
// HTTP/2 like client-go and drops its idle connections at every rotation.
// Nothing ever skips verification. TLSClientConfig.CAData holds the bundle as
// of this call; client-go uses it only where WrapTransport is not applied.
//
// How derived configurations behave:
//
//   - rest.CopyConfig, and changing UserAgent, QPS, Burst, Timeout, ContentType
//     or similar on the copy: keeps WrapTransport, so trust keeps following
//     rotation. rest.Config.Wrap layers further round trippers on top.
//   - rest.HTTPClientFor, rest.RESTClientFor, kubernetes.NewForConfig and
//     other clients built from the config: follow rotation; a client built
//     once works for the life of the server. client-go's transport cache is
//     not involved in verification (it only caches the unused static
//     transport built from CAData).
//   - rest.AnonymousClientConfig: drops BearerToken and WrapTransport (it
//     copies only "known safe" fields) but keeps ServerName and CAData, so
//     TLS still verifies, like upstream, against the bundle as of this call.
//     That holds while the served leaf is signed by a CA in that snapshot:
//     with the default schedule, between a third of a Validity and about
//     two Validities after this call. After that it fails closed with an
//     unknown-authority error. Use (*Certificate).AnonymousClientConfig to
//     keep following rotation.
//   - Replacing WrapTransport (rather than calling Wrap) falls back to the
//     CAData snapshot in the same way; setting Transport is rejected by
//     client-go because the config carries CAData.
//   - Upgrade requests (exec, attach, port-forward through SPDY or
//     websockets) use client-go's own round trippers and the CAData snapshot.
//   - TLSClientConfig (ServerName, CAData, client certificates), Proxy, Dial
//     and DisableCompression changed on a derived config do not apply to
//     normal requests: the loopback transport always dials Host directly,
//     sends and verifies ServerName against the current bundle and presents
//     no client certificate. (Insecure cannot be combined with CAData;
//     client-go rejects such a config.)
func (c *Certificate) RestConfig(bindAddress, token string) (*rest.Config, error) {
	host, port, err := HostPort(bindAddress)
	if err != nil {
		return nil, err
	}
	if token == "" {
		token = uuid.NewString()
	}
	return &rest.Config{
		Host:        "https://" + net.JoinHostPort(host, port),
		BearerToken: token,
		// Do not limit loopback client QPS.
		QPS: -1,
		TLSClientConfig: rest.TLSClientConfig{
			ServerName: ServerName,
			CAData:     bytes.Clone(c.CurrentCABundleContent()),
		},
		WrapTransport: c.WrapTransport,
	}, nil
}

// AnonymousClientConfig is rest.AnonymousClientConfig(config) with this
// Certificate's rotating trust put back: the result carries no credentials
// and verifies every new connection against the current CA bundle.
func (c *Certificate) AnonymousClientConfig(config *rest.Config) *rest.Config {
	anon := rest.AnonymousClientConfig(config)
	anon.WrapTransport = c.WrapTransport
	return anon
}
