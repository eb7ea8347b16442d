package handshake

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// TestServersServeAlike checks what makes the benchmarks a fair comparison:
// the example server and both comparison servers, given the same files,
// present the same certificates, verify client certificates against the
// same CA, and resume TLS 1.3 sessions. It also checks, from outside the
// process, that the example server keeps resuming sessions across a
// rotation of an unrelated SNI certificate (a snapshot swap): tickets are
// encrypted with the listener config's keys, not the snapshot's.
func TestServersServeAlike(t *testing.T) {
	c := loadCerts(t)
	f := writeFiles(t, c)
	targets := startTargets(t, append(f.servingArgs(),
		"--tls-sni-cert-key="+f.sniCert+","+f.sniKey,
		"--client-ca-file="+f.clientCA)...)

	stranger, err := pki.NewCA(pki.Request{CommonName: "stranger-ca", Now: time.Now(), Lifetime: time.Hour})
	require.NoError(t, err)
	strangerLeaf, err := pki.IssueLeaf(stranger, pki.Request{CommonName: "stranger", Now: time.Now(), Lifetime: time.Hour})
	require.NoError(t, err)
	strangerCert, err := tls.X509KeyPair(strangerLeaf.CertPEM, strangerLeaf.KeyPEM)
	require.NoError(t, err)

	resuming := map[string]*tls.Config{}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			st, err := tlstest.Exchange(tg.addr, clientConfig(c))
			require.NoError(t, err)
			assert.Equal(t, c.serving.Cert.SerialNumber, st.PeerCertificates[0].SerialNumber, "serving certificate")
			assert.Equal(t, "h2", st.NegotiatedProtocol)

			sni := clientConfig(c)
			sni.ServerName = sniName
			st, err = tlstest.Exchange(tg.addr, sni)
			require.NoError(t, err)
			assert.Equal(t, c.sni[0].Cert.SerialNumber, st.PeerCertificates[0].SerialNumber, "SNI certificate")

			// GetClientCertificate sends the certificate whatever CAs the
			// server names, and tells that the server asked for one.
			var present *tls.Certificate
			requested := false
			withCert := clientConfig(c)
			withCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				requested = true
				return present, nil
			}
			present = &c.client
			_, err = tlstest.Exchange(tg.addr, withCert)
			require.NoError(t, err, "a client certificate from the client CA is accepted")
			assert.True(t, requested, "the server asks for a client certificate")
			present = &strangerCert
			_, err = tlstest.Exchange(tg.addr, withCert)
			require.Error(t, err, "a client certificate from another CA is rejected")

			cfg := clientConfig(c)
			cfg.SessionTicketsDisabled = false
			cfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
			_, err = tlstest.Exchange(tg.addr, cfg)
			require.NoError(t, err)
			st, err = tlstest.Exchange(tg.addr, cfg)
			require.NoError(t, err)
			require.True(t, st.DidResume, "the second connection resumes")
			resuming[tg.name] = cfg
		})
	}
	if t.Failed() {
		return
	}

	// Rotate the SNI certificate; once the reloading servers present it,
	// the tickets from before still resume.
	next := c.sni[1]
	writeFile(t, f.sniKey, next.KeyPEM)
	writeFile(t, f.sniCert, next.CertPEM)
	for _, tg := range targets {
		if tg.name == kindStatic {
			continue
		}
		require.NoError(t, waitServed(tg.addr, next.Cert.SerialNumber.Text(16)), tg.name)
	}
	for _, tg := range targets {
		st, err := tlstest.Exchange(tg.addr, resuming[tg.name])
		require.NoError(t, err, tg.name)
		assert.True(t, st.DidResume, "%s: a ticket from before the SNI rotation resumes after it", tg.name)
	}
}
