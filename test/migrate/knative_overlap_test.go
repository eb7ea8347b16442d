package migrate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/webhook/certificates/resources"

	"github.com/evercert/evercert/authority"
)

// TestMigrateFromKnativeWhileItRotates is issue 27 §8 bullet 1 for knative
// on the real kube-apiserver: TestMigrateFromKnative with knative's webhook
// pods still running while the two evercert replicas start on its Secret
// (LayoutKnative), as a rolling update straight from them does. Three of
// knative.dev/pkg's parts run as loops (knative's reconcilers need its
// injection framework and informers; their steps are replicated, the
// certificates are knative's own, made by resources.MakeSecret):
//
//   - the certificate reconciler (webhook/certificates/certificates.go,
//     reconciler.reconcileCertificate, on every event of the Secret):
//     knativeNeedsCerts is its condition, then the Secret as read gets
//     Data = MakeSecret's (a new CA and leaf valid a week, resources.oneWeek,
//     every other key dropped) and is Updated;
//   - the validating webhook reconciler
//     (webhook/resourcesemantics/validation/reconcile_config.go,
//     reconciler.Reconcile and reconcileValidatingWebhook, on every event
//     of the Secret or of the configuration): caBundle = ca-cert.pem;
//   - the webhook's GetCertificate (webhook/webhook.go, New): the Secret's
//     server-cert.pem and server-key.pem at each handshake, no certificate
//     when either is missing.
//
// When knative rewrites during the overlap: its condition looks at its own
// keys only, and MakeSecret's leaf is valid a week, so it rewrites only
// when one of ca-cert.pem, server-cert.pem, server-key.pem is missing
// (or the leaf unparsable or within a day of expiry). evercert's adoption
// (LayoutKnative) keeps those keys while its replicas serve knative's leaf
// and publish a successor beside knative's CA; once the successor is
// observed and signs, the replicas switch to leaves of their own and
// remove knative's keys from the Secret. The certificate reconciler
// answers that write at once with a new CA, all of evercert's keys
// dropped, and the webhook reconciler swaps that CA alone into the
// caBundle: that rewrite is the other writer the replicas must hold. The
// test counts the reconciler's Updates and requires at least one in the
// overlap (migrateWhileOldRuns), which lasts long enough for the
// successor to be observed (35s after it was published, see
// env.startReplicas).
//
// After the overlap the reconcilers stop; the old pods keep serving from
// the Secret as knative's GetCertificate does until the front switches,
// and migrateWhileOldRuns checks the rest: every replica reported the
// other writer (Stalled, ForeignWriter) and stayed ready while it served a
// valid leaf, adopted knative's last CA once, 0 failed calls from
// knative's stop on, at most three CAs in ca.crt at the end. Calls during
// the overlap are counted and logged, not checked: between evercert's
// removal of knative's keys and knative's rewrite the old pods have no
// certificate, and after it they serve a leaf of a CA that only the
// rewrite's caBundle trusts.
func TestMigrateFromKnativeWhileItRotates(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	secrets := e.client.CoreV1().Secrets(ns)

	// The old pods' informer: the Secret as they last read it, which their
	// GetCertificate serves from; it runs until the test ends.
	var view atomic.Pointer[corev1.Secret]
	viewCtx, stopView := context.WithCancel(e.ctx)
	viewDone := make(chan struct{})
	go func() {
		defer close(viewDone)
		for viewCtx.Err() == nil {
			if s, err := secrets.Get(viewCtx, secretName, metav1.GetOptions{}); err == nil {
				view.Store(s)
			}
			select {
			case <-viewCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stopView(); <-viewDone })
	e.front.use(func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		s := view.Load()
		if s == nil {
			return nil, errors.New("knative's webhook has not read its Secret yet")
		}
		key, ok := s.Data[resources.ServerKey]
		if !ok {
			return nil, errors.New("knative's webhook: server key missing")
		}
		cert, ok := s.Data[resources.ServerCert]
		if !ok {
			return nil, errors.New("knative's webhook: server cert missing")
		}
		pair, err := tls.X509KeyPair(cert, key)
		return &pair, err
	})

	// The two reconcilers, until knative stops (the real ones act on
	// events; these poll). rewrites counts the certificate reconciler's
	// Updates, lastCA is the CA of its last one.
	var rewrites atomic.Int64
	var lastCA atomic.Pointer[x509.Certificate]
	recCtx, stopRec := context.WithCancel(e.ctx)
	recDone := make(chan struct{})
	go func() {
		defer close(recDone)
		for recCtx.Err() == nil {
			s, err := secrets.Get(recCtx, secretName, metav1.GetOptions{})
			if err == nil && knativeNeedsCerts(s, time.Now()) {
				// A failed Update (a conflict) is retried on the next
				// round, as knative's work queue requeues the key.
				var made *corev1.Secret
				if made, err = resources.MakeSecret(recCtx, secretName, ns, svcName); err == nil {
					s.Data = made.Data
					if s, err = secrets.Update(recCtx, s, metav1.UpdateOptions{}); err == nil {
						lastCA.Store(parsePEM(t, made.Data[resources.CACert])[0])
						rewrites.Add(1)
					}
				}
			}
			if err == nil {
				if ca, ok := s.Data[resources.CACert]; ok {
					_ = e.injectCABundle(ca)
				}
			}
			select {
			case <-recCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stopRec(); <-recDone })
	e.waitForWebhook()

	e.migrateWhileOldRuns("knative", authority.LayoutKnative, 2*time.Minute, func() (int64, *x509.Certificate) { return rewrites.Load(), lastCA.Load() }, func() {
		stopRec()
		<-recDone
	})
	require.NotNil(t, lastCA.Load())
}

// knativeNeedsCerts is the condition of knative.dev/pkg's certificate
// reconciler (webhook/certificates/certificates.go,
// reconciler.reconcileCertificate, at the version in go.mod) for writing
// new certificates to the Secret: one of its three keys is absent, the
// leaf and key do not make a pair, the leaf does not parse, or the leaf
// expires within a day (oneDay) of now.
func knativeNeedsCerts(s *corev1.Secret, now time.Time) bool {
	for _, k := range []string{resources.ServerKey, resources.ServerCert, resources.CACert} {
		if _, ok := s.Data[k]; !ok {
			return true
		}
	}
	pair, err := tls.X509KeyPair(s.Data[resources.ServerCert], s.Data[resources.ServerKey])
	if err != nil {
		return true
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return true
	}
	return !now.Add(24 * time.Hour).Before(leaf.NotAfter)
}
