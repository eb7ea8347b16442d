package server

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	cliflag "k8s.io/component-base/cli/flag"

	"github.com/evercert/evercert/sni"
)

// serveGuard is how long a test waits for Serve to return before failing:
// generous, since it guards against a hang, not a slow machine.
const serveGuard = 30 * time.Second

// serveUntilReturn runs s.Serve on a context that never ends and returns
// its error, failing the test if Serve has not returned within serveGuard.
func serveUntilReturn(t *testing.T, s *Serving) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, http.NotFoundHandler()) }()
	select {
	case err := <-done:
		cancel()
		return err
	case <-time.After(serveGuard):
		// Unblock the hung Serve so it does not leak into later tests.
		cancel()
		<-done
		t.Fatalf("Serve did not return within %v of a start-up error; it returned only when its context ended", serveGuard)
		return nil
	}
}

// servingGoroutines counts the goroutines running evercert's serving loops
// or an http.Server accept loop.
func servingGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, frame := range []string{
			"evercert/server.(*Serving).",
			"evercert/sni.(*DynamicServingCertificateController).Run",
			"evercert/dynamiccert.(*SelfSigned).Run",
			"net/http.(*Server).Serve",
		} {
			if strings.Contains(g, frame) {
				count++
				break
			}
		}
	}
	return count
}

// TestServeReturnsListenError: a port in use makes Serve return promptly
// with the address in the error, having stopped everything it started.
func TestServeReturnsListenError(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	addr := busy.Addr().String()

	o := NewOptions()
	o.SecurePort = busy.Addr().(*net.TCPAddr).Port
	s, err := o.Build()
	require.NoError(t, err)
	before := servingGoroutines()
	err = serveUntilReturn(t, s)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "listening on "+addr)
	assert.Contains(t, err.Error(), "address already in use")
	assert.Nil(t, s.Addr())
	assert.LessOrEqual(t, servingGoroutines(), before, "Serve left goroutines running")
}

// TestServeReturnsServeTLSError: when http.Server.ServeTLS refuses the
// config after the listener is open (here: a controller whose suites HTTP/2
// cannot use, which Build no longer produces), Serve returns that error
// promptly, names the address, closes the listener and stops its
// goroutines.
func TestServeReturnsServeTLSError(t *testing.T) {
	o := NewOptions()
	o.SecurePort = 0
	s, err := o.Build()
	require.NoError(t, err)
	s.Controller, err = sni.NewDynamicServingCertificateController(sni.ControllerConfig{
		Base: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA},
			NextProtos:   []string{"h2", "http/1.1"},
		},
		ClientCA: s.ClientCA, Serving: s.Serving, SNI: s.SNI,
	})
	require.NoError(t, err)
	before := servingGoroutines()
	err = serveUntilReturn(t, s)
	require.Error(t, err)
	require.NotNil(t, s.Addr(), "the listener was opened")
	assert.Contains(t, err.Error(), "serving on "+s.Addr().String())
	assert.Contains(t, err.Error(), "HTTP/2-required")
	assert.LessOrEqual(t, servingGoroutines(), before, "Serve left goroutines running")
	_, err = net.Dial("tcp", s.Addr().String())
	assert.Error(t, err, "the listener is closed")
}

// TestValidateHTTP2CipherSuites checks Validate against the rule of
// net/http's bundled HTTP/2 server, and checks that rule against net/http
// itself: Validate refuses exactly the (version, suites) pairs
// http.Server.ServeTLS would refuse.
func TestValidateHTTP2CipherSuites(t *testing.T) {
	const h2Refusal = "HTTP/2 requires"
	for _, tc := range []struct {
		name    string
		args    []string
		refused bool
	}{
		{"defaults", nil, false},
		{"ecdsa aes128 gcm alone", []string{"--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}, false},
		{"rsa aes128 gcm alone", []string{"--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}, false},
		{"cbc with a required suite", []string{"--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}, false},
		{"cbc only", []string{"--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"}, true},
		{"aes256 gcm only", []string{"--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"}, true},
		{"chacha only", []string{"--tls-cipher-suites=TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"}, true},
		{"tls 1.3 names only", []string{"--tls-cipher-suites=TLS_AES_128_GCM_SHA256"}, true},
		{"cbc only, TLS 1.0 floor", []string{"--tls-min-version=VersionTLS10", "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"}, true},
		{"cbc only, TLS 1.3 floor: the list is ignored", []string{"--tls-min-version=VersionTLS13", "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"}, false},
		{"empty list: Go's defaults", []string{"--tls-cipher-suites="}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(t, tc.args...)
			if tc.refused {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "--tls-cipher-suites")
				assert.Contains(t, err.Error(), h2Refusal)
				assert.Contains(t, err.Error(), "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")
			} else {
				require.NoError(t, err)
			}

			// net/http agrees.
			minVersion, err := cliflag.TLSVersion(o.MinTLSVersion)
			require.NoError(t, err)
			suites, err := cliflag.TLSCipherSuites(o.CipherSuites)
			require.NoError(t, err)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			require.NoError(t, ln.Close()) // ServeTLS then returns at its first Accept
			srv := &http.Server{TLSConfig: &tls.Config{
				MinVersion: minVersion, CipherSuites: suites,
				GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return nil, nil },
			}}
			serr := srv.ServeTLS(ln, "", "")
			require.Error(t, serr)
			assert.Equal(t, tc.refused, strings.Contains(serr.Error(), "HTTP/2-required"), "net/http said: %v", serr)
		})
	}
}

// TestCipherSuiteHelpListsOnlyAcceptedValues: every value --help offers
// for --tls-cipher-suites is accepted by Validate, and none of Go's
// insecure suites is offered.
func TestCipherSuiteHelpListsOnlyAcceptedValues(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	usage := fs.Lookup("tls-cipher-suites").Usage
	_, list, ok := strings.Cut(usage, "Possible values: ")
	require.True(t, ok, usage)
	values := strings.Split(list, ", ")
	require.NotEmpty(t, values)
	var refused []string
	for _, v := range values {
		// Alone, or with a suite HTTP/2 requires: either way Validate must
		// be able to accept it.
		_, errAlone := parse(t, "--tls-cipher-suites="+v)
		_, errWith := parse(t, "--tls-cipher-suites="+v+",TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
		if errAlone != nil && errWith != nil {
			refused = append(refused, v)
		}
	}
	assert.Empty(t, refused, "help offers suites that Validate refuses")
	var insecure []string
	for _, s := range tls.InsecureCipherSuites() {
		if slices.Contains(values, s.Name) {
			insecure = append(insecure, s.Name)
		}
	}
	assert.Empty(t, insecure, "help offers insecure suites")
	assert.NotContains(t, usage, "RC4")
	assert.NotContains(t, usage, "3DES")
	assert.Contains(t, usage, "HTTP/2", "help states the HTTP/2 rule")
	for _, s := range DefaultCipherSuites {
		assert.Contains(t, values, s, "a default suite is missing from the help")
	}
}
