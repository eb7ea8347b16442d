package cabundle

import (
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/evercert/evercert/internal/pki"
)

// testCA is a CAContentProvider whose bundle a test can change; it notifies
// its listeners the way evercert's providers do.
type testCA struct {
	mu        sync.Mutex
	bundle    []byte
	listeners []dynamiccertificates.Listener
}

var _ dynamiccertificates.CAContentProvider = &testCA{}

func newTestCA(bundle []byte) *testCA { return &testCA{bundle: bundle} }

func (c *testCA) Name() string { return "test-ca" }

func (c *testCA) CurrentCABundleContent() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bundle
}

func (c *testCA) VerifyOptions() (x509.VerifyOptions, bool) {
	pool, _, err := pki.NewPool(c.CurrentCABundleContent())
	if err != nil {
		return x509.VerifyOptions{}, false
	}
	return x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, true
}

func (c *testCA) AddListener(l dynamiccertificates.Listener) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listeners = append(c.listeners, l)
}

// set changes the bundle and notifies the listeners.
func (c *testCA) set(bundle []byte) {
	c.mu.Lock()
	c.bundle = bundle
	ls := append([]dynamiccertificates.Listener(nil), c.listeners...)
	c.mu.Unlock()
	for _, l := range ls {
		l.Enqueue()
	}
}

// newBundle returns the PEM of a fresh self-signed CA.
func newBundle(t testing.TB, name string) []byte {
	t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: name, Now: time.Now(), Lifetime: time.Hour})
	if err != nil {
		t.Fatalf("new CA: %v", err)
	}
	if _, err := pki.ParseCABundle(ca.CertPEM); err != nil {
		t.Fatalf("parse CA bundle: %v", err)
	}
	return ca.CertPEM
}

// publishCounts returns evercert_cabundle_publish_total for kind, by result.
func publishCounts(t testing.TB, kind Kind) map[string]float64 {
	t.Helper()
	got, err := testutil.GetCounterValuesFromGatherer(legacyregistry.DefaultGatherer,
		"evercert_cabundle_publish_total", map[string]string{"kind": string(kind)}, "result")
	if err != nil {
		// Not registered yet, or no sample for kind.
		return map[string]float64{}
	}
	return got
}

// countsDelta returns after-before for every result.
func countsDelta(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for _, r := range []string{resultSuccess, resultUnchanged, resultConflict, resultError} {
		if v := after[r] - before[r]; v != 0 {
			d[r] = v
		}
	}
	return d
}

// eventually polls cond every 20 ms until it returns true or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
