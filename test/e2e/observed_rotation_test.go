//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/example/webhook/app"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
)

// offsetClock is the real clock shifted by offset: Now is time.Now()+offset,
// and everything that waits (timers, tickers) is the real clock's, since
// durations are relative. It stands for a replica whose wall clock is off.
type offsetClock struct{ offset time.Duration }

var _ clock.WithTicker = offsetClock{}

func (c offsetClock) Now() time.Time                       { return time.Now().Add(c.offset) }
func (c offsetClock) Since(ts time.Time) time.Duration     { return c.Now().Sub(ts) }
func (offsetClock) After(d time.Duration) <-chan time.Time { return clock.RealClock{}.After(d) }
func (offsetClock) NewTimer(d time.Duration) clock.Timer   { return clock.RealClock{}.NewTimer(d) }
func (offsetClock) Sleep(d time.Duration)                  { clock.RealClock{}.Sleep(d) }
func (offsetClock) Tick(d time.Duration) <-chan time.Time  { return clock.RealClock{}.Tick(d) }
func (offsetClock) NewTicker(d time.Duration) clock.Ticker { return clock.RealClock{}.NewTicker(d) }
func (offsetClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return clock.RealClock{}.AfterFunc(d, f)
}

// startWebhookReplicaWithClock is startWebhookReplica with an injected
// clock (server.Options.Clock, which the Authority, the caBundle publisher
// and the sni controller use).
func startWebhookReplicaWithClock(t *testing.T, kubeconfig string, clk clock.WithTicker, args ...string) *app.Webhook {
	t.Helper()
	opts := app.NewOptions()
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
	opts.AddFlags(fs)
	require.NoError(t, fs.Parse(append([]string{
		"--bind-address=127.0.0.1", "--secure-port=0",
		"--kubeconfig=" + kubeconfig, "--ca-secret=" + ns + "/" + webhookCASecret,
		"--self-signed-hosts=evercert-example-webhook." + ns + ".svc,127.0.0.1",
		"--register-url=https://127.0.0.1",
	}, args...)))
	opts.ShutdownTimeout = 2 * time.Second
	opts.Clock = clk
	w, err := app.New(opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "webhook replica")
		case <-time.After(15 * time.Second):
			t.Error("webhook replica did not stop within 15s")
		}
	})
	return w
}

// caBundleTarget is one webhook configuration a replica publishes to.
type caBundleTarget struct {
	kind, name string
}

func (c caBundleTarget) key() string { return c.kind + "/" + c.name }

const (
	vwcKind = "ValidatingWebhookConfiguration"
	mwcKind = "MutatingWebhookConfiguration"
)

// bundleState is one value a webhook configuration's caBundle held, as a
// watch saw it.
type bundleState struct {
	at  time.Time
	rv  int64
	fps map[string]bool // fingerprints of the CAs in the caBundle
}

// secretEvent is one version of the CA Secret, as a watch saw it.
type secretEvent struct {
	at         time.Time
	rv         int64
	signing    string // common name of tls.crt
	next       bool   // next.crt present
	bundleSize int
}

// rotationObserver follows the CA Secret and the three webhook
// configurations through informers (which survive the API server restart)
// and records, with resourceVersions, when the successor was published and
// promoted and what every caBundle held in between.
type rotationObserver struct {
	initial *x509.Certificate
	kick    chan struct{} // a configuration changed (for the competing writer)

	mu             sync.Mutex
	successor      *x509.Certificate
	publishedAt    time.Time // next.crt first seen in the Secret
	publishedRV    int64
	promotedAt     time.Time // tls.crt first seen to be the successor
	promotedRV     int64
	secretWrites   int
	secretEvents   []secretEvent
	secretProblems []string
	bundles        map[string][]bundleState
	published      chan struct{}
	promoted       chan struct{}
}

func parseRV(rv string) int64 {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func fingerprints(bundle []byte) map[string]bool {
	out := map[string]bool{}
	certs, err := pki.ParseCABundle(bundle)
	if err != nil {
		return out
	}
	for _, c := range certs {
		out[authority.Fingerprint(c)] = true
	}
	return out
}

func (o *rotationObserver) secret(obj any) {
	s, ok := obj.(*corev1.Secret)
	if !ok || s.Name != webhookCASecret {
		return
	}
	now := time.Now()
	rv := parseRV(s.ResourceVersion)
	signing, err := pki.ParseCABundle(s.Data[corev1.TLSCertKey])
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.secretEvents); n > 0 && o.secretEvents[n-1].rv == rv {
		return // a relist after the API server restart
	}
	o.secretWrites++
	problem := func(format string, args ...any) {
		o.secretProblems = append(o.secretProblems, fmt.Sprintf("rv %s: ", s.ResourceVersion)+fmt.Sprintf(format, args...))
	}
	if err != nil || len(signing) != 1 {
		problem("tls.crt holds %d certificates (err %v)", len(signing), err)
		return
	}
	bundle := fingerprints(s.Data[dynamiccert.SecretCAKey])
	o.secretEvents = append(o.secretEvents, secretEvent{at: now, rv: rv, signing: signing[0].Subject.CommonName,
		next: len(s.Data[authority.NextCertKey]) > 0, bundleSize: len(bundle)})
	if !bundle[authority.Fingerprint(signing[0])] {
		problem("the signing CA is not in ca.crt")
	}
	if next := s.Data[authority.NextCertKey]; len(next) > 0 {
		certs, err := pki.ParseCABundle(next)
		if err != nil || len(certs) != 1 {
			problem("next.crt holds %d certificates (err %v)", len(certs), err)
		} else {
			if !bundle[authority.Fingerprint(certs[0])] {
				problem("the successor is not in ca.crt")
			}
			switch {
			case o.successor == nil:
				o.successor, o.publishedAt, o.publishedRV = certs[0], now, rv
				close(o.published)
			case !o.successor.Equal(certs[0]):
				problem("a second successor %q was published", certs[0].Subject.CommonName)
			}
		}
	}
	switch {
	case signing[0].Equal(o.initial):
	case o.successor != nil && signing[0].Equal(o.successor):
		if o.promotedAt.IsZero() {
			o.promotedAt, o.promotedRV = now, rv
			close(o.promoted)
		}
	default:
		problem("signing CA %q is neither the initial CA nor the published successor (a CA that was never observed)", signing[0].Subject.CommonName)
	}
}

func (o *rotationObserver) config(obj any) {
	var key string
	var bundle []byte
	var rvs string
	switch c := obj.(type) {
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		if len(c.Webhooks) == 0 {
			return
		}
		key, bundle, rvs = vwcKind+"/"+c.Name, c.Webhooks[0].ClientConfig.CABundle, c.ResourceVersion
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		if len(c.Webhooks) == 0 {
			return
		}
		key, bundle, rvs = mwcKind+"/"+c.Name, c.Webhooks[0].ClientConfig.CABundle, c.ResourceVersion
	default:
		return
	}
	rv := parseRV(rvs)
	o.mu.Lock()
	if _, ok := o.bundles[key]; ok {
		states := o.bundles[key]
		if len(states) == 0 || states[len(states)-1].rv != rv {
			o.bundles[key] = append(states, bundleState{at: time.Now(), rv: rv, fps: fingerprints(bundle)})
		}
	}
	o.mu.Unlock()
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// watchRotation starts informers on the CA Secret and the webhook
// configurations targets; they stop when the test ends.
func watchRotation(t *testing.T, admin kubernetes.Interface, initial *x509.Certificate, targets []caBundleTarget) *rotationObserver {
	t.Helper()
	o := &rotationObserver{
		initial: initial, kick: make(chan struct{}, 1), bundles: map[string][]bundleState{},
		published: make(chan struct{}), promoted: make(chan struct{}),
	}
	for _, tg := range targets {
		o.bundles[tg.key()] = nil
	}
	factory := informers.NewSharedInformerFactoryWithOptions(admin, 0, informers.WithNamespace(ns))
	handler := func(f func(any)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{AddFunc: f, UpdateFunc: func(_, obj any) { f(obj) }}
	}
	_, err := factory.Core().V1().Secrets().Informer().AddEventHandler(handler(o.secret))
	require.NoError(t, err)
	_, err = factory.Admissionregistration().V1().ValidatingWebhookConfigurations().Informer().AddEventHandler(handler(o.config))
	require.NoError(t, err)
	_, err = factory.Admissionregistration().V1().MutatingWebhookConfigurations().Informer().AddEventHandler(handler(o.config))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		require.True(t, ok, "informer %v synced", typ)
	}
	return o
}

// competeCABundle is another writer of the caBundles (a stale Helm value):
// until ctx ends, each time a target's caBundle is not stale it writes
// stale back, with an Update under field manager "helm".
func competeCABundle(ctx context.Context, admin kubernetes.Interface, o *rotationObserver, targets []caBundleTarget, stale []byte) (writes, conflicts int, failures []string) {
	vwcs := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	mwcs := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	opts := metav1.UpdateOptions{FieldManager: "helm"}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, tg := range targets {
			var err error
			switch tg.kind {
			case vwcKind:
				var cur *admissionregistrationv1.ValidatingWebhookConfiguration
				if cur, err = vwcs.Get(ctx, tg.name, metav1.GetOptions{}); err == nil {
					if bytes.Equal(cur.Webhooks[0].ClientConfig.CABundle, stale) {
						continue
					}
					cur.Webhooks[0].ClientConfig.CABundle = stale
					_, err = vwcs.Update(ctx, cur, opts)
				}
			case mwcKind:
				var cur *admissionregistrationv1.MutatingWebhookConfiguration
				if cur, err = mwcs.Get(ctx, tg.name, metav1.GetOptions{}); err == nil {
					if bytes.Equal(cur.Webhooks[0].ClientConfig.CABundle, stale) {
						continue
					}
					cur.Webhooks[0].ClientConfig.CABundle = stale
					_, err = mwcs.Update(ctx, cur, opts)
				}
			}
			switch {
			case ctx.Err() != nil:
				return
			case err == nil:
				writes++
			case strings.Contains(err.Error(), "the object has been modified"):
				conflicts++
			case strings.Contains(err.Error(), "would exceed context deadline"):
				// The client's rate limiter, as ctx ends.
			default:
				failures = append(failures, err.Error())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-o.kick:
		case <-tick.C:
		}
	}
}

// replicaProbe handshakes with a replica every few hundred milliseconds to
// see which CA signed the leaf it serves, and reads its /readyz to see
// whether its publisher reports a contested caBundle.
type replicaProbe struct {
	name string
	w    *app.Webhook

	mu                 sync.Mutex
	firstSuccessorLeaf time.Time
	successorLeaf      *x509.Certificate
	leaves             map[string]bool // serials seen
	lastLeaf           string          // serial of the leaf served at the last probe
	contestedSeen      int
	contestedSample    string
	probeErrors        int
	lastProbeError     string
}

func (p *replicaProbe) run(ctx context.Context, o *rotationObserver) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		o.mu.Lock()
		successor := o.successor
		o.mu.Unlock()
		leaf, err := tlstest.Dial(p.w.Addr().String(), &tls.Config{InsecureSkipVerify: true})
		p.mu.Lock()
		if err != nil {
			p.probeErrors++
			p.lastProbeError = err.Error()
		} else {
			p.leaves[leaf.SerialNumber.Text(16)] = true
			p.lastLeaf = leaf.SerialNumber.Text(16)
			if successor != nil && p.firstSuccessorLeaf.IsZero() && leaf.CheckSignatureFrom(successor) == nil {
				p.firstSuccessorLeaf, p.successorLeaf = time.Now(), leaf
			}
		}
		p.mu.Unlock()
		if i%3 != 0 {
			continue
		}
		// /readyz over HTTPS, verified with the replica's own bundle.
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{RootCAs: bundlePool(p.w.CABundle())},
		}}
		// The check's own path returns its error; /readyz?verbose
		// withholds the reason.
		resp, err := hc.Get("https://" + p.w.Addr().String() + "/readyz/cabundle")
		var body []byte
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		p.mu.Lock()
		switch {
		case err != nil:
			p.probeErrors++
			p.lastProbeError = err.Error()
		case strings.Contains(string(body), "contested"):
			p.contestedSeen++
			if p.contestedSample == "" {
				p.contestedSample = strings.TrimSpace(string(body))
			}
		}
		p.mu.Unlock()
	}
}

func bundlePool(bundle []byte) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	return pool
}

// isWebhookCallError reports whether err comes from the API server calling
// (or failing to call, or to trust) an admission webhook.
func isWebhookCallError(err error) bool {
	s := err.Error()
	for _, m := range []string{"failed calling webhook", "admission webhook", "x509", "tls:", "certificate"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

func publishTotals(t *testing.T, result string) (vwc, mwc float64) {
	return certmetricstest.Value(t, "evercert_cabundle_publish_total", map[string]string{"kind": vwcKind, "result": result}),
		certmetricstest.Value(t, "evercert_cabundle_publish_total", map[string]string{"kind": mwcKind, "result": result})
}

// TestE2EObservedRotation proves observed CA rotation on a real
// kube-apiserver under faults. Three example/webhook replicas share one CA
// Secret, with clocks 30 minutes behind, right and 30 minutes ahead; each
// publishes its own webhook configuration (A and C validating, B
// mutating), so every ConfigMap create goes through all three. The
// pre-created CA reaches its renewal point on C's clock about 20 s in: C
// publishes the successor. While it waits to be observed, another writer
// puts the old caBundle back into every configuration for 10 s, then the
// API server is stopped for 10 s. ConfigMaps are created at 20/s
// throughout: not one admission may fail, no rotation may be unsafe, the
// successor must not sign while any caBundle lacks it, and in the end every
// replica serves (and announces in its Lease) a leaf signed by it.
//
// The replicas' clocks are 60 minutes apart, so --clock-skew-tolerance is
// 1h; EVERCERT_E2E_SKEW_TOLERANCE=45m reproduces what happens beyond the
// tolerance (replica A never serves the successor's leaf within the test).
func TestE2EObservedRotation(t *testing.T) {
	const (
		rate            = 20 // creates per second
		workers         = 4
		unlabelledEvery = 25
		renewIn         = 20 * time.Second // until the CA's renewal point on C's clock
		competeFor      = 10 * time.Second
		apiDownFor      = 10 * time.Second
		after           = 10 * time.Second // load after every replica serves the successor's leaf
		bound           = 4 * time.Minute
	)
	testStart := time.Now()
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: webhookUser}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	webhookNamespaces(t, admin)
	applyWebhookRBAC(t, admin, webhookUser, webhookCASecret, "webhook-a", "webhook-b", "webhook-c")
	kubeconfig := writeKubeconfig(t, cluster.UserConfig(webhookUser))
	ctx := context.Background()

	// The initial CA: valid since two hours ago on every replica's clock,
	// and renewed (--ca-renew-before=3h) about renewIn from now on the
	// clock of the replica 30 minutes ahead, long after the test on the
	// others.
	caCreated := time.Now()
	initial, err := pki.NewCA(pki.Request{
		CommonName: "e2e-observed-initial-ca", Now: caCreated,
		Backdate: 2 * time.Hour, Lifetime: 30*time.Minute + 3*time.Hour + renewIn,
	})
	require.NoError(t, err)
	_, err = admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: webhookCASecret},
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			corev1.TLSCertKey: initial.CertPEM, corev1.TLSPrivateKeyKey: initial.KeyPEM, dynamiccert.SecretCAKey: initial.CertPEM,
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	targets := []caBundleTarget{{vwcKind, "webhook-a"}, {mwcKind, "webhook-b"}, {vwcKind, "webhook-c"}}
	obs := watchRotation(t, admin, initial.Cert, targets)

	unsafeBefore := certmetricstest.Value(t, "evercert_unsafe_rotations_total", map[string]string{"provider": "ca-secret"})
	loadErrorsBefore := certmetricstest.LoadErrors(t, "ca-secret")
	metricResults := []string{"success", "unchanged", "conflict", "contested", "error"}
	before := map[string][2]float64{}
	for _, r := range metricResults {
		v, m := publishTotals(t, r)
		before[r] = [2]float64{v, m}
	}

	// Replicas may disagree by up to the skew tolerance (authority's
	// package documentation); A and C are 60 minutes apart, so the
	// tolerance is one hour (the library's default). With less, say
	// EVERCERT_E2E_SKEW_TOLERANCE=45m, C's successor is not yet valid on
	// A's clock by up to the difference: A adopts it (a CA not yet valid
	// by less than the tolerance is accepted) but its own sni controller
	// rejects the leaf it signs, and A keeps serving the old CA's leaf.
	skewTolerance := "1h"
	if v := os.Getenv("EVERCERT_E2E_SKEW_TOLERANCE"); v != "" {
		skewTolerance = v
	}
	flags := []string{
		"--clock-skew-tolerance=" + skewTolerance, "--self-signed-validity=2h",
		"--ca-validity=10h", "--ca-renew-before=3h", "--ca-propagation-delay=5s",
	}
	t.Logf("replica flags: %s; clocks -30m, +0, +30m", strings.Join(flags, " "))
	type replicaSpec struct {
		name   string
		offset time.Duration
		args   []string
	}
	specs := []replicaSpec{
		{"A (-30m)", -30 * time.Minute, []string{"--validating-webhook-configuration=webhook-a", "--mutating-webhook-configuration="}},
		{"B (+0)", 0, []string{"--validating-webhook-configuration=", "--mutating-webhook-configuration=webhook-b"}},
		{"C (+30m)", 30 * time.Minute, []string{"--validating-webhook-configuration=webhook-c", "--mutating-webhook-configuration="}},
	}
	var replicas []*app.Webhook
	var probes []*replicaProbe
	for _, s := range specs {
		w := startWebhookReplicaWithClock(t, kubeconfig, offsetClock{s.offset}, append(slices.Clone(flags), s.args...)...)
		replicas = append(replicas, w)
		probes = append(probes, &replicaProbe{name: s.name, w: w, leaves: map[string]bool{}})
	}
	waitReady(t, replicas...)
	t.Logf("replicas ready %v after the CA was created; its renewal point on C's clock is %v after",
		time.Since(caCreated).Round(time.Millisecond), renewIn)

	// The caBundle as it was before the successor: the stale value the
	// other writer puts back.
	stale := replicas[0].CABundle()
	select {
	case <-obs.published:
		t.Fatalf("the successor was published before the replicas were ready; raise renewIn")
	default:
	}
	require.Equal(t, fingerprints(initial.CertPEM), fingerprints(stale), "the caBundle before the successor holds the initial CA only")

	probeCtx, stopProbes := context.WithCancel(ctx)
	var probeWG sync.WaitGroup
	for _, p := range probes {
		probeWG.Go(func() { p.run(probeCtx, obs) })
	}
	defer func() { stopProbes(); probeWG.Wait() }()

	// The load: ConfigMap creates at rate until stopLoad.
	var apiDown atomic.Bool
	var admitted, denied, failed, apiErrors, behind atomic.Int64
	var failMu sync.Mutex
	var failures, apiSamples []string
	cms := admin.CoreV1().ConfigMaps(webhookEnabledNS)
	work := make(chan int, 2*workers)
	var loadWG sync.WaitGroup
	for range workers {
		loadWG.Go(func() {
			for i := range work {
				labelled := i%unlabelledEvery != 0
				downAtStart := apiDown.Load()
				reqCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
				cm, err := cms.Create(reqCtx, newConfigMap(fmt.Sprintf("observed-%05d", i), labelled), metav1.CreateOptions{})
				cancel()
				var problem string
				switch {
				case !labelled && isDenial(err):
					denied.Add(1)
				case labelled && err == nil && cm.Annotations[app.DefaultedAnnotation] == "true":
					admitted.Add(1)
				case err == nil && labelled:
					problem = fmt.Sprintf("observed-%05d (labelled): admitted but not mutated: annotations %v", i, cm.Annotations)
				case err == nil:
					problem = fmt.Sprintf("observed-%05d (no label): admitted, want a denial", i)
				case !isWebhookCallError(err) && (downAtStart || apiDown.Load()):
					// The API server itself is stopped: not an admission.
					n := apiErrors.Add(1)
					if n <= 3 {
						failMu.Lock()
						apiSamples = append(apiSamples, err.Error())
						failMu.Unlock()
					}
				default:
					problem = fmt.Sprintf("observed-%05d (labelled %v): %v", i, labelled, err)
				}
				if problem != "" {
					failed.Add(1)
					failMu.Lock()
					failures = append(failures, time.Now().Format("15:04:05.000")+" "+problem)
					failMu.Unlock()
				}
			}
		})
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadStart := time.Now()
	var loadDone sync.WaitGroup
	var loadElapsed time.Duration
	var sent int
	loadDone.Go(func() {
		defer func() { close(work); loadWG.Wait(); loadElapsed = time.Since(loadStart) }()
		for i := 0; ; i++ {
			due := loadStart.Add(time.Duration(i) * time.Second / rate)
			select {
			case <-loadCtx.Done():
				sent = i
				return
			case <-time.After(time.Until(due)):
			}
			select {
			case work <- i:
			default:
				behind.Add(1)
				work <- i
			}
		}
	})
	finishLoad := sync.OnceFunc(func() { stopLoad(); loadDone.Wait() })
	defer finishLoad()

	deadline := time.After(time.Until(testStart.Add(bound)))

	// Publish: C reaches the renewal point.
	select {
	case <-obs.published:
	case <-deadline:
		t.Fatalf("no successor was published within %v of the test start", bound)
	}
	obs.mu.Lock()
	successor, publishedAt := obs.successor, obs.publishedAt
	obs.mu.Unlock()
	t.Logf("successor %q (serial %s) published %v after the CA was created",
		successor.Subject.CommonName, successor.SerialNumber.Text(16), publishedAt.Sub(caCreated).Round(time.Millisecond))

	// Fault (a): a competing writer puts the stale caBundle back.
	competeCtx, stopCompete := context.WithTimeout(ctx, competeFor)
	helm := kubernetes.NewForConfigOrDie(cluster.Config()) // its own client, as another tool would have
	writerWrites, writerConflicts, writerFailures := competeCABundle(competeCtx, helm, obs, targets, stale)
	stopCompete()
	writerStopped := time.Now()
	select {
	case <-obs.promoted:
		t.Errorf("the successor was promoted while the competing writer kept the caBundles stale")
	default:
	}
	t.Logf("competing writer (field manager helm) stopped after %v: %d writes, %d conflicts, %d other errors %q",
		writerStopped.Sub(publishedAt).Round(time.Millisecond), writerWrites, writerConflicts, len(writerFailures), writerFailures)

	// Fault (b): the API server stops while the successor waits.
	select {
	case <-obs.promoted:
		t.Errorf("scenario: the successor signed before the API server was stopped; fault (b) did not hit a waiting successor")
	default:
	}
	apiDown.Store(true)
	stoppedAt := time.Now()
	cluster.StopAPIServer(t)
	time.Sleep(apiDownFor)
	cluster.StartAPIServer(t)
	apiDown.Store(false)
	restartedAt := time.Now()
	t.Logf("kube-apiserver stopped at +%v (since published) and ready again %v later",
		stoppedAt.Sub(publishedAt).Round(time.Millisecond), restartedAt.Sub(stoppedAt).Round(time.Millisecond))

	// Observe, then promote: every replica ends up serving the successor's
	// leaf.
	allServe := func() bool {
		for _, p := range probes {
			p.mu.Lock()
			ok := !p.firstSuccessorLeaf.IsZero()
			p.mu.Unlock()
			if !ok {
				return false
			}
		}
		return true
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	converged := false
	for !converged {
		select {
		case <-deadline:
			converged = true // give up; reported below
		case <-tick.C:
			converged = allServe()
		}
	}
	if allServe() {
		time.Sleep(after) // admissions keep succeeding with the new leaves
	}
	finishLoad()
	stopProbes()
	probeWG.Wait()

	// Report.
	obs.mu.Lock()
	promotedAt, promotedRV, publishedRV := obs.promotedAt, obs.promotedRV, obs.publishedRV
	secretWrites, secretProblems, secretEvents := obs.secretWrites, slices.Clone(obs.secretProblems), slices.Clone(obs.secretEvents)
	bundles := map[string][]bundleState{}
	for k, v := range obs.bundles {
		bundles[k] = slices.Clone(v)
	}
	obs.mu.Unlock()
	successorFP := authority.Fingerprint(successor)

	var firstLeaf time.Time
	for _, p := range probes {
		p.mu.Lock()
		served := "never"
		if !p.firstSuccessorLeaf.IsZero() {
			served = fmt.Sprintf("+%v (leaf serial %s, NotBefore %s)", p.firstSuccessorLeaf.Sub(publishedAt).Round(time.Millisecond),
				p.successorLeaf.SerialNumber.Text(16), p.successorLeaf.NotBefore.UTC().Format(time.RFC3339))
			if firstLeaf.IsZero() || p.firstSuccessorLeaf.Before(firstLeaf) {
				firstLeaf = p.firstSuccessorLeaf
			}
		}
		t.Logf("replica %s at %s: serves a leaf signed by the successor from %s; %d distinct leaves seen; /readyz reported contested %d times (%s); %d probe errors (last: %s)",
			p.name, p.w.Addr(), served, len(p.leaves), p.contestedSeen, p.contestedSample, p.probeErrors, p.lastProbeError)
		assert.False(t, p.firstSuccessorLeaf.IsZero(), "replica %s serves a leaf signed by the successor", p.name)
		assert.Positive(t, p.contestedSeen, "replica %s reported its caBundle contested on /readyz", p.name)
		p.mu.Unlock()
	}

	leases, err := admin.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: authority.LeaseLabel + "=" + webhookCASecret})
	require.NoError(t, err)
	var announced, served []string
	for _, l := range leases.Items {
		t.Logf("lease %s: holder %s, leaf serial %s, trusted %s", l.Name, ptrString(l.Spec.HolderIdentity),
			l.Annotations[authority.LeafSerialAnnotation], l.Annotations[authority.TrustedCAsAnnotation])
		announced = append(announced, l.Annotations[authority.LeafSerialAnnotation])
	}
	for _, p := range probes {
		p.mu.Lock()
		served = append(served, p.lastLeaf)
		p.mu.Unlock()
	}
	// Each replica announces the leaf it serves.
	assert.ElementsMatch(t, served, announced, "leaf serials served (last handshake with each replica) and announced in the Leases")

	deltas := map[string][2]float64{}
	for _, r := range metricResults {
		v, m := publishTotals(t, r)
		deltas[r] = [2]float64{v - before[r][0], m - before[r][1]}
	}
	unsafe := certmetricstest.Value(t, "evercert_unsafe_rotations_total", map[string]string{"provider": "ca-secret"}) - unsafeBefore
	loadErrors := certmetricstest.LoadErrors(t, "ca-secret") - loadErrorsBefore

	creates := admitted.Load() + denied.Load() + failed.Load() + apiErrors.Load()
	promotion := "never"
	if !firstLeaf.IsZero() {
		promotion = fmt.Sprintf("%.1fs", firstLeaf.Sub(publishedAt).Seconds())
	}
	secretPromotion := "never"
	if !promotedAt.IsZero() {
		secretPromotion = fmt.Sprintf("%.1fs", promotedAt.Sub(publishedAt).Seconds())
	}
	t.Logf("observed rotation report: promotion %s from the successor's publication (next.crt first seen) to the first leaf signed by it "+
		"(tls.crt switched in the Secret at %s; writer stopped at %.1fs, API server down %.1fs-%.1fs); "+
		"%d creates in %v (%d sent; %d admitted and mutated, %d denied as designed, workers behind %d times); %d failed admissions; %d API-down errors %q; "+
		"caBundle publishes validating/mutating: success %v/%v, contested %v/%v, conflict %v/%v, error %v/%v, unchanged %v/%v; "+
		"unsafe rotations %v; ca-secret load errors %v; %d CA Secret writes; %d replica Leases",
		promotion, secretPromotion, writerStopped.Sub(publishedAt).Seconds(), stoppedAt.Sub(publishedAt).Seconds(), restartedAt.Sub(publishedAt).Seconds(),
		creates, loadElapsed.Round(time.Millisecond), sent, admitted.Load(), denied.Load(), behind.Load(), failed.Load(), apiErrors.Load(), apiSamples,
		deltas["success"][0], deltas["success"][1], deltas["contested"][0], deltas["contested"][1], deltas["conflict"][0], deltas["conflict"][1],
		deltas["error"][0], deltas["error"][1], deltas["unchanged"][0], deltas["unchanged"][1],
		unsafe, loadErrors, secretWrites, len(leases.Items))

	rel := func(at time.Time) string { return fmt.Sprintf("%+.1fs", at.Sub(publishedAt).Seconds()) }
	for _, e := range secretEvents {
		t.Logf("CA Secret rv %d at %s: signing %q, successor waiting %v, ca.crt %d CAs", e.rv, rel(e.at), e.signing, e.next, e.bundleSize)
	}
	for _, tg := range targets {
		var line []string
		for _, s := range bundles[tg.key()] {
			what := "stale"
			if s.fps[successorFP] {
				what = "with successor"
			}
			line = append(line, fmt.Sprintf("rv %d at %s %s", s.rv, rel(s.at), what))
		}
		t.Logf("%s caBundle timeline: %s", tg.key(), strings.Join(line, "; "))
	}

	// The successor signed only once every caBundle held it: at the
	// Secret write that promoted it (ordered by resourceVersion), the last
	// value each configuration had held it, and none lost it afterwards.
	for _, tg := range targets {
		states := bundles[tg.key()]
		staleAfterPublish := 0
		var atPromotion *bundleState
		for i, s := range states {
			if s.rv > publishedRV && !s.fps[successorFP] {
				staleAfterPublish++
			}
			if promotedRV > 0 && s.rv < promotedRV {
				atPromotion = &states[i]
			}
			if promotedRV > 0 && s.rv > promotedRV && !s.fps[successorFP] {
				t.Errorf("%s: caBundle at rv %d (after the promotion at rv %d) lacks the successor", tg.key(), s.rv, promotedRV)
			}
		}
		t.Logf("%s: %d caBundle values seen, %d of them after the publication lacked the successor", tg.key(), len(states), staleAfterPublish)
		assert.Positive(t, staleAfterPublish, "%s: the competing writer made the caBundle stale", tg.key())
		if promotedRV > 0 {
			if assert.NotNil(t, atPromotion, "%s: a caBundle value before the promotion", tg.key()) {
				assert.True(t, atPromotion.fps[successorFP], "%s: the successor signed (Secret rv %d) while the caBundle (rv %d) lacked it",
					tg.key(), promotedRV, atPromotion.rv)
			}
		}
	}

	for i, f := range failures {
		if i == 20 {
			t.Errorf("... and %d more failures", len(failures)-i)
			break
		}
		t.Errorf("failed admission: %s", f)
	}
	assert.Zero(t, failed.Load(), "failed admissions")
	assert.Zero(t, unsafe, "unsafe rotations (evercert_unsafe_rotations_total{provider=ca-secret})")
	assert.Empty(t, secretProblems, "CA Secret invariants")
	assert.False(t, promotedAt.IsZero(), "the successor was promoted in the Secret")
	assert.True(t, promotedAt.IsZero() || promotedAt.After(writerStopped), "the successor signed only after the competing writer stopped")
	assert.Positive(t, apiErrors.Load(), "the load ran while the API server was down")
	assert.Positive(t, denied.Load(), "unlabelled ConfigMaps were denied")
	assert.Positive(t, deltas["contested"][0], "validating publishers reported contested")
	assert.Positive(t, deltas["contested"][1], "the mutating publisher reported contested")
	assert.Len(t, leases.Items, len(replicas), "one Lease per replica")
	assert.GreaterOrEqual(t, creates, int64(float64(rate)*loadElapsed.Seconds()*8/10), "the load ran at about the intended rate")
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
