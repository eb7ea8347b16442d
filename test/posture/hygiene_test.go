package posture

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	// hygieneRun is how long the rotating server runs: with a 3s leaf
	// (renewed 1s before expiry) and a 9s CA (successor 3s before expiry)
	// that is three or four leaf rotations and one CA rotation.
	hygieneRun      = 8 * time.Second
	rotationsMetric = `evercert_certificate_rotations_total{provider="self-signed"}`
)

// fetchMetrics GETs /metrics trusting only the CA bundle file as it is now.
func fetchMetrics(ctx context.Context, addr, bundleFile string) (string, error) {
	bundle, err := os.ReadFile(bundleFile)
	if err != nil {
		return "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return "", fmt.Errorf("no certificate in %s", bundleFile)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return string(body), nil
}

// metricValue returns the value of the sample named exactly series.
func metricValue(metrics, series string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(metrics))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// TestNoKeyMaterialInOutput runs the example server with the most verbose
// logging through several rotations of its certificate and CA, and checks
// that nothing it prints looks like key material, and that the only file it
// writes, the CA bundle, is public: 0644 and certificates only.
func TestNoKeyMaterialInOutput(t *testing.T) {
	bundleDir := t.TempDir()
	bundleFile := filepath.Join(bundleDir, "ca.crt")
	srv := startServer(t, "-v=10", "--self-signed-validity=3s", "--ca-bundle-file="+bundleFile)

	// Talk to the server while it rotates (each request is a fresh
	// handshake, verified against the bundle file as it is then), and
	// record the rotation count.
	ctx, cancel := context.WithTimeout(context.Background(), hygieneRun+time.Minute)
	defer cancel()
	start := time.Now()
	var (
		rotations float64
		fetched   int
		lastErr   error
	)
	for time.Since(start) < hygieneRun || fetched == 0 {
		if ctx.Err() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
		// A request can race a rotation (new leaf served, bundle file
		// not yet rewritten); it is retried at the next tick.
		metrics, err := fetchMetrics(ctx, srv.Addr, bundleFile)
		if err != nil {
			lastErr = err
			continue
		}
		v, ok := metricValue(metrics, rotationsMetric)
		require.True(t, ok, "no %s in /metrics:\n%s", rotationsMetric, metrics)
		rotations, fetched = v, fetched+1
	}
	require.Positive(t, fetched, "no /metrics request succeeded; last error: %v", lastErr)
	t.Logf("%d /metrics requests succeeded; %s = %v after %v", fetched, rotationsMetric, rotations, time.Since(start).Round(time.Millisecond))
	assert.GreaterOrEqual(t, rotations, 2.0, "expected several rotations in %v with --self-signed-validity=3s", hygieneRun)

	srv.Stop(t)
	out := srv.Output()
	// The run really was verbose and really rotated.
	assert.Contains(t, out, "Wrote CA bundle file", "V(2) logs missing: was -v=10 applied?")
	assert.Contains(t, out, "Published successor CA", "no CA rotation during the run")
	assert.NotContains(t, out, "PRIVATE KEY")
	assert.NotContains(t, out, "-----BEGIN")
	assert.NotContains(t, out, "-----END")
	if t.Failed() {
		t.Logf("server output:\n%s", out)
	}

	// The CA bundle is public data: 0644, certificates only.
	info, err := os.Stat(bundleFile)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o644), info.Mode().Perm(), "CA bundle file mode")
	bundle, err := os.ReadFile(bundleFile)
	require.NoError(t, err)
	n := 0
	rest := bundle
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		n++
		assert.Equal(t, "CERTIFICATE", block.Type, "CA bundle block %d", n)
		assert.Empty(t, block.Headers, "CA bundle block %d", n)
		cert, err := x509.ParseCertificate(block.Bytes)
		if assert.NoError(t, err, "CA bundle block %d", n) {
			assert.True(t, cert.IsCA, "CA bundle block %d is not a CA", n)
		}
	}
	assert.Positive(t, n, "no certificate in the CA bundle")
	assert.Empty(t, bytes.TrimSpace(rest), "trailing data in the CA bundle")

	// Any file the server left behind that holds a key must be 0600; and
	// the atomic bundle writes must leave no temporary files.
	for _, dir := range []string{bundleDir, srv.Dir} {
		require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			assert.False(t, strings.HasPrefix(d.Name(), ".ca-bundle-"), "temporary file left behind: %s", path)
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(data, []byte("PRIVATE KEY")) {
				info, err := d.Info()
				if err != nil {
					return err
				}
				assert.Equal(t, fs.FileMode(0o600), info.Mode().Perm(), "%s holds a private key", path)
			}
			return nil
		}))
	}
}
