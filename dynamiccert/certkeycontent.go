package dynamiccert

import (
	"bytes"
	"crypto/tls"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/pki"
)

// zeroTime asks pki.ParseCertKey to skip the validity-date checks, for
// pairs whose dates whoever uses them checks on its own clock (static
// content, a CA read from a Secret).
var zeroTime time.Time

// certKeyContent is a certificate and key a provider serves: the PEM it hands
// out and the pair parsed from it, which the sni controller serves as is
// (CurrentParsedCertKeyContent) instead of parsing the PEM again. It is
// immutable once stored.
type certKeyContent struct {
	cert, key []byte
	pair      *pki.KeyPair
}

// parsed returns the content as CurrentParsedCertKeyContent does: nil, nil,
// nil when there is none.
func (c *certKeyContent) parsed() (certPEM, keyPEM []byte, cert *tls.Certificate) {
	if c == nil {
		return nil, nil, nil
	}
	return c.cert, c.key, &c.pair.TLS
}

// storeCertKey validates a new pair and, if it differs from the current
// one, stores it and reports the change (one log line, the metrics, an
// Event on rotation). It reports whether the content changed; on error
// nothing changes, and the error, marked with the content it is about, is
// for the caller to report with its source attached. sourceKind and source
// say where the pair came from in the log line.
func storeCertKey(cur *atomic.Pointer[certKeyContent], r *reporter, certPEM, keyPEM []byte, now time.Time, sourceKind, source string) (bool, error) {
	prev := cur.Load()
	if prev != nil && bytes.Equal(prev.cert, certPEM) && bytes.Equal(prev.key, keyPEM) {
		if r.succeeded() {
			klog.Background().Info("Content is valid again, serving the same certificate", "provider", r.Provider())
		}
		return false, nil
	}
	pair, err := pki.ParseCertKey(certPEM, keyPEM, now)
	if err != nil {
		// Two different bad contents are two failures, even with the same
		// message; the same one retried is one.
		return false, certreport.WithContent(err, certPEM, keyPEM)
	}
	cur.Store(&certKeyContent{cert: certPEM, key: keyPEM, pair: pair})
	r.succeeded()
	r.Loaded(pair.Leaf, sourceKind, source)
	return true, nil
}
