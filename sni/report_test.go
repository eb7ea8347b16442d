package sni

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
	"github.com/evercert/evercert/internal/klogtest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/loopback"
)

// Every certificate provider of evercert hands out its content parsed.
var (
	_ ParsedCertKeyProvider = &dynamiccert.StaticCertKey{}
	_ ParsedCertKeyProvider = &dynamiccert.FileCertKey{}
	_ ParsedCertKeyProvider = &dynamiccert.SecretCertKey{}
	_ ParsedCertKeyProvider = &authority.SelfSigned{}
	_ ParsedCertKeyProvider = &authority.Authority{}
	_ ParsedCertKeyProvider = &loopback.Certificate{}
)

// TestEachChangeIsParsedLoggedAndCountedOnce serves a self-signed provider,
// a file provider (both evercert's) and a provider from outside evercert
// through the real Run loops on a fake clock, and rotates each twice: the
// self-signed one by its own schedule, the file one by new files, the other
// one by new content. Each change must be parsed once (evercert's providers
// by themselves: the controller never parses them again), and logged once,
// at the default verbosity, with the provider, subject, serial, NotAfter and
// issuer but no key material, and counted once as a rotation.
func TestEachChangeIsParsedLoggedAndCountedOnce(t *testing.T) {
	logs := klogtest.Capture(t)
	clk := clocktesting.NewFakeClock(time.Now())
	prefix := t.Name() + "/"

	self, err := authority.NewSelfSigned(authority.SelfSignedConfig{
		Name: prefix + "self-signed", Hosts: []string{"self.test"}, Lifetime: time.Hour, Clock: clk,
	})
	require.NoError(t, err)

	ca := newTestCA(t, clk.Now(), "file-ca")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writePair := func(iss *pki.Issued) {
		// The key first: the pair is complete once the certificate lands.
		require.NoError(t, os.WriteFile(keyFile, iss.KeyPEM, 0o600))
		require.NoError(t, os.WriteFile(certFile, iss.CertPEM, 0o600))
	}
	fileLeaf := func() *pki.Issued {
		return issueLeaf(t, ca, leafSpec{cn: "file.test", dns: []string{"file.test"}, now: clk.Now()})
	}
	writePair(fileLeaf())
	file, err := dynamiccert.NewFileCertKey(dynamiccert.FileCertKeyConfig{
		Name: prefix + "file", CertFile: certFile, KeyFile: keyFile, Clock: clk,
	})
	require.NoError(t, err)
	require.NoError(t, file.RunOnce(context.Background()))

	foreignLeaf := func() *pki.Issued {
		return issueLeaf(t, ca, leafSpec{cn: "foreign.test", dns: []string{"foreign.test"}, now: clk.Now()})
	}
	foreign := newMutable(prefix+"foreign", foreignLeaf())

	c := newController(t, ControllerConfig{
		Serving: self,
		SNI:     []dynamiccertificates.SNICertKeyContentProvider{file, foreign},
		Clock:   clk,
		Name:    "report-test",
	})
	parses := countParses(c)
	swapped := make(chanListener, 1)
	c.AddListener(swapped)
	runController(t, self)
	runController(t, file)
	runController(t, c)
	waitFor(t, swapped, "the first snapshot")
	srv := startServer(t, c.TLSConfig())
	serial := func(name string) string { return servedSerial(t, srv.addr, clientConfig(clk, name)).Text(16) }
	served := func(name, want string) {
		t.Helper()
		require.Eventually(t, func() bool { return serial(name) == want }, 10*time.Second, 5*time.Millisecond, "%s serves %s", name, want)
	}

	providers := []string{self.Name(), file.Name(), foreign.Name()}
	rotationsBefore := map[string]float64{}
	for _, p := range providers {
		rotationsBefore[p] = certmetricstest.Rotations(t, p)
	}
	servedSerials := map[string][]string{
		self.Name():    {serial("self.test")},
		file.Name():    {serial("file.test")},
		foreign.Name(): {serial("foreign.test")},
	}

	for range 2 {
		// The self-signed leaf is due: its Run loop, waiting on its timer
		// (next to the file provider's resync ticker), renews it at the
		// deadline on its clock.
		old := self.Leaf()
		require.Eventually(t, func() bool { return clk.Waiters() >= 2 }, 10*time.Second, time.Millisecond, "the loops wait on the clock")
		clk.SetTime(self.RenewAt())
		require.Eventually(t, func() bool { return !self.Leaf().Equal(old) }, 10*time.Second, 5*time.Millisecond, "the self-signed leaf renewed")
		served("self.test", self.Leaf().SerialNumber.Text(16))
		servedSerials[self.Name()] = append(servedSerials[self.Name()], serial("self.test"))

		next := fileLeaf()
		writePair(next)
		served("file.test", next.Cert.SerialNumber.Text(16))
		servedSerials[file.Name()] = append(servedSerials[file.Name()], next.Cert.SerialNumber.Text(16))

		next = foreignLeaf()
		foreign.SetIssued(next)
		served("foreign.test", next.Cert.SerialNumber.Text(16))
		servedSerials[foreign.Name()] = append(servedSerials[foreign.Name()], next.Cert.SerialNumber.Text(16))
	}

	out := logs.String()
	for _, p := range providers {
		lines := logs.Lines(`msg="Loaded certificate"`, "provider="+p+" ")
		require.Len(t, lines, 3, "%s: one line per certificate it served, the first and two rotations:\n%s", p, out)
		for i, line := range lines {
			assert.Contains(t, line, "level=INFO", "at the default verbosity")
			assert.Contains(t, line, "serial="+servedSerials[p][i], "%s: the served certificates, in order", p)
			assert.Regexp(t, `subject=\S+ `, line)
			assert.Regexp(t, `notAfter=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ `, line, "NotAfter in RFC 3339")
			assert.Regexp(t, `issuer=\S+ `, line)
		}
		assert.Equal(t, rotationsBefore[p]+2, certmetricstest.Rotations(t, p), "%s: two rotations", p)
	}
	assert.Contains(t, logs.Lines(`msg="Loaded certificate"`, "provider="+self.Name()+" ")[0], `issuer=`+self.Name()+"-ca@", "the CA says which it is")
	assert.Zero(t, parses.get(self.Name()), "the controller never parses what the self-signed provider parsed")
	assert.Zero(t, parses.get(file.Name()), "the controller never parses what the file provider parsed")
	assert.Equal(t, 3, parses.get(foreign.Name()), "the controller parses a foreign provider's content once per change")
	assert.NotContains(t, out, "PRIVATE KEY")
	assert.NotContains(t, out, "BEGIN")
	assert.Zero(t, logs.Count("level=ERROR"), out)
}

// TestControllerEventsForWhatItParses: with WithEventRecorder, the
// controller sends a Normal CertificateRotated Event for a foreign
// provider's new certificate and one Warning CertificateLoadFailed Event per
// distinct rejected content, and nothing for an evercert provider, which
// sends its own.
func TestControllerEventsForWhatItParses(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, clk.Now(), "events-ca")
	leaf := func() *pki.Issued {
		return issueLeaf(t, ca, leafSpec{cn: "foreign.test", dns: []string{"foreign.test"}, now: clk.Now()})
	}
	foreign := newMutable(t.Name()+"/foreign", leaf())
	self, err := authority.NewSelfSigned(authority.SelfSignedConfig{Name: t.Name() + "/self-signed", Lifetime: time.Hour, Clock: clk})
	require.NoError(t, err)
	recorder := certreporttest.NewRecorder()
	c := newController(t, ControllerConfig{
		Serving:       self,
		SNI:           []dynamiccertificates.SNICertKeyContentProvider{foreign},
		Clock:         clk,
		EventRecorder: recorder,
		EventObject:   certreporttest.Pod,
	})
	swapped := make(chanListener, 1)
	c.AddListener(swapped)
	runController(t, self)
	runController(t, c)
	waitFor(t, swapped, "the first snapshot")

	next := leaf()
	foreign.SetIssued(next)
	waitFor(t, swapped, "the swap to the new foreign certificate")
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond, "the self-signed loop waits on the clock")
	clk.SetTime(self.RenewAt()) // the self-signed provider rotates: its Event, not the controller's
	waitFor(t, swapped, "the swap to the new self-signed certificate")

	bad := []byte("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
	foreign.Set(bad, next.KeyPEM)
	require.Eventually(t, func() bool { return len(recorder.Events) >= 2 }, 10*time.Second, 5*time.Millisecond)
	c.Enqueue() // the same bad content read again
	foreign.Set(append(bad, bad...), next.KeyPEM)
	require.Eventually(t, func() bool { return len(recorder.Events) >= 3 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, c.RunOnce(context.Background())) // and again: no further Event

	got := certreporttest.Drain(recorder)
	require.Len(t, got, 3, "%q", got)
	assert.True(t, strings.HasPrefix(got[0], "Normal CertificateRotated Rotate "), got[0])
	assert.Contains(t, got[0], next.Cert.SerialNumber.Text(16))
	for _, e := range got[1:] {
		assert.True(t, strings.HasPrefix(e, "Warning CertificateLoadFailed Load "), e)
		assert.Contains(t, e, foreign.Name())
		assert.NotContains(t, e, "BEGIN")
	}
}
