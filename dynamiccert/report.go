package dynamiccert

import (
	"bytes"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/errlog"
	"github.com/evercert/evercert/internal/pki"
)

// reporter counts every rejected load but logs a failure only when it
// differs from the previous one (internal/errlog), so a bad file or Secret
// seen on every event and every resync produces one log line, not a stream.
type reporter struct {
	name string
	log  errlog.Once
}

// failed records err (which must name the source) and returns it.
func (r *reporter) failed(err error) error {
	certmetrics.LoadError(r.name)
	r.log.Error(klog.Background(), err, "Rejected new content, still serving the last good content", "provider", r.name)
	return err
}

// succeeded clears the last error and reports whether there was one; the
// caller logs the recovery in its own line.
func (r *reporter) succeeded() (recovered bool) { return r.log.Reset() }

func (r *reporter) lastError() error { return r.log.Err() }

// storeCertKey validates a new pair and, if it differs from the current
// one, stores it and records the rotation. It reports whether the content
// changed; on error nothing changes and the caller reports the error with
// its source attached. sourceKind and source describe where the pair came
// from in the log line.
func storeCertKey(cur *atomic.Pointer[certKeyContent], r *reporter, certPEM, keyPEM []byte, now time.Time, sourceKind, source string) (bool, error) {
	prev := cur.Load()
	if prev != nil && bytes.Equal(prev.cert, certPEM) && bytes.Equal(prev.key, keyPEM) {
		if r.succeeded() {
			klog.InfoS("Content is valid again, serving the same certificate", "provider", r.name)
		}
		return false, nil
	}
	pair, err := pki.ParseCertKey(certPEM, keyPEM, now)
	if err != nil {
		return false, err
	}
	cur.Store(&certKeyContent{cert: certPEM, key: keyPEM, pair: pair})
	recovered := r.succeeded()
	certmetrics.CertificateLoaded(r.name, pair.Leaf.SerialNumber.Text(16), pair.Leaf.NotAfter)
	logger := klog.V(2)
	if recovered {
		// The failure was logged at error level; make its end visible too.
		logger = klog.V(0)
	}
	leaf := pair.Leaf
	logger.InfoS("Loaded serving certificate", "provider", r.name, sourceKind, source,
		"subject", leaf.Subject.String(), "dnsNames", leaf.DNSNames, "ipAddresses", leaf.IPAddresses,
		"serial", leaf.SerialNumber.Text(16), "notBefore", leaf.NotBefore.UTC(), "notAfter", leaf.NotAfter.UTC(),
		"rotated", prev != nil)
	return true, nil
}
