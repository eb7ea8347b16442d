package migrate

import (
	"bytes"
	"context"
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	cmtls "github.com/cert-manager/cert-manager/pkg/server/tls"
	cmauthority "github.com/cert-manager/cert-manager/pkg/server/tls/authority"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
)

// cmCommonName is the CommonName cert-manager's DynamicAuthority gives
// every CA it makes here (its default). evercert names its CAs
// "<name>-ca@<unix seconds>", so a CA with this name in tls.crt was
// written by cert-manager.
const cmCommonName = "cert-manager-webhook-ca"

// TestMigrateFromCertManagerWhileItRotates is issue 27 §8 bullet 1 for
// cert-manager on the real kube-apiserver: TestMigrateFromCertManager with
// cert-manager's webhook (its real DynamicSource on its real
// DynamicAuthority) and the cainjector stand-in still running while the two
// evercert replicas start on its Secret (LayoutCertManager), as a rolling
// update straight from cert-manager's webhook pods does.
//
// When cert-manager rewrites (cert-manager v1.21.2,
// pkg/server/tls/authority/authority.go): DynamicAuthority.ensureCA runs
// on every informer event of the Secret (handleAdd, handleUpdate,
// handleDelete) and every 10s (Run's PollUntilContextCancel), and
// regenerates the CA (regenerateCA: a new P-384 CA written to tls.crt,
// tls.key and ca.crt of the Secret as read, other keys and annotations
// kept, Update) whenever caRequiresRegeneration says so: a key missing,
// ca.crt not byte-equal to tls.crt ("Different data in ca.crt and
// tls.crt."), an unparsable pair, tls.crt not a CA, or less than a third
// of the CA's lifetime left. evercert's layout keeps every CA still
// trusted in ca.crt, and its replicas publish a successor within their
// first checks for cert-manager's 3-minute CA here (ca.crt = adopted CA +
// successor; 18s after they started in a run on 2026-11-30), so the event
// of that write makes cert-manager regenerate within the informer's
// latency (the same second in that run), and every later adoption by the
// replicas (the held CA plus the CAs served leaves need) does the same:
// cert-manager answers each adoption with a new CA, as cert-controller
// does. Its 3-minute CA would also be regenerated two minutes after it
// was made (the third-of-lifetime rule), in the overlap or not. The test
// counts those rewrites (distinct CAs named cmCommonName in tls.crt, seen
// by polling the Secret) and requires at least one in the overlap
// (migrateWhileOldRuns).
//
// The old pods serve, during the overlap, cert-manager's DynamicSource,
// which re-signs its leaf on each new CA (DynamicAuthority.notifyWatches
// on the informer event of its own write); the cainjector stand-in copies
// ca.crt into the webhook configuration as it is each time (evercert's
// bundle while evercert wrote last, cert-manager's new CA alone after a
// rewrite). Then cert-manager and the cainjector stop, the old pods keep
// the last leaf until the front switches, and migrateWhileOldRuns checks
// the rest: every replica reported the other writer (Stalled,
// ForeignWriter) and stayed ready while it served a valid leaf, adopted
// once, 0 failed calls from cert-manager's stop on, at most three CAs in
// ca.crt at the end. Calls during the overlap are counted and logged, not
// checked: each rewrite swaps cert-manager's new CA alone into the
// caBundle (the cainjector's copy of ca.crt).
func TestMigrateFromCertManagerWhileItRotates(t *testing.T) {
	t.Parallel()
	e := startEnv(t)
	src := &cmtls.DynamicSource{
		DNSNames: []string{dnsName},
		Authority: &cmauthority.DynamicAuthority{
			SecretNamespace: ns, SecretName: secretName, RESTConfig: e.cluster.Config(),
			CommonName: cmCommonName, CADuration: 3 * time.Minute, LeafDuration: time.Minute,
		},
	}
	cmCtx, stopCM := context.WithCancel(e.ctx)
	cmDone := make(chan error, 1)
	go func() { cmDone <- src.Start(cmCtx) }()
	t.Cleanup(func() { stopCM(); <-cmDone })
	e.front.use(src.GetCertificate)

	// The cainjector's part, until cert-manager stops (the real one acts
	// on the Secret's events; this polls). It also counts cert-manager's
	// CAs: each new one in tls.crt is a regeneration.
	var rewrites atomic.Int64
	var lastCA atomic.Pointer[x509.Certificate]
	var last []byte // tls.crt of cert-manager's last CA seen; observe's alone
	observe := func(ctx context.Context) []byte {
		s, err := e.client.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		if certs := parsePEM(t, s.Data["tls.crt"]); len(certs) == 1 && certs[0].Subject.CommonName == cmCommonName && !bytes.Equal(s.Data["tls.crt"], last) {
			last = s.Data["tls.crt"]
			lastCA.Store(certs[0])
			rewrites.Add(1)
		}
		return s.Data["ca.crt"]
	}
	injCtx, stopInj := context.WithCancel(e.ctx)
	injDone := make(chan struct{})
	go func() {
		defer close(injDone)
		for injCtx.Err() == nil {
			if ca := observe(injCtx); len(ca) > 0 {
				_ = e.injectCABundle(ca)
			}
			select {
			case <-injCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stopInj(); <-injDone })
	waitUntil(t, "cert-manager's source to serve", time.Minute, src.Healthy)
	e.waitForWebhook()

	e.migrateWhileOldRuns("cert-manager", authority.LayoutCertManager, time.Minute, func() (int64, *x509.Certificate) { return rewrites.Load(), lastCA.Load() }, func() {
		stopInj()
		<-injDone
		// cert-manager's webhook pods keep serving the leaf they have
		// until the front switches; its authority and renewals stop.
		leaf, err := src.GetCertificate(nil)
		require.NoError(t, err, "cert-manager's leaf")
		e.front.use(staticCert(leaf))
		stopCM()
		require.NoError(t, <-cmDone)
		cmDone <- nil // for the cleanup
		// A regeneration between the cainjector's last look and the stop
		// is cert-manager's last CA too (its leaf chains to it).
		observe(e.ctx)
		require.NoError(t, leaf.Leaf.CheckSignatureFrom(lastCA.Load()), "the old pods' last leaf chains to cert-manager's last CA")
	})
}
