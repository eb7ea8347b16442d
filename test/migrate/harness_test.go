package migrate

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/internal/testcluster"
)

// The webhook every test serves: a ValidatingWebhookConfiguration on
// ConfigMap creation in namespace ns, failurePolicy Fail, calling Service
// svcName, which is of type ExternalName "localhost": the kube-apiserver
// (aggregator routing off) dials localhost:<front port> and verifies the
// serving certificate for svcName.ns.svc. A URL clientConfig
// (https://127.0.0.1:<port>) cannot be used: cert-controller and knative
// issue leaves with DNS names only.
const (
	ns         = "migrate"
	svcName    = "webhook"
	dnsName    = svcName + "." + ns + ".svc"
	secretName = "webhook-cert"
	vwcName    = "migrate-webhook"
)

// env is one kube-apiserver with the webhook registered and the front
// listener serving it.
type env struct {
	t       *testing.T
	ctx     context.Context
	cluster *testcluster.Cluster
	client  kubernetes.Interface
	front   *front
	load    *load
}

func startEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cluster := testcluster.Start(t, testcluster.WithAPIServerFlags("--enable-aggregator-routing=false"))
	client := kubernetes.NewForConfigOrDie(cluster.Config())
	e := &env{t: t, ctx: ctx, cluster: cluster, client: client, front: startFront(t)}
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	path, port, timeout := "/validate", int32(e.front.port), int32(10)
	_, err = client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: vwcName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "configmaps.migrate.evercert.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: svcName, Path: &path, Port: &port},
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          &timeout,
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	// The Secret as a Deployment's manifests create it, empty, for the
	// tool to fill (cert-controller and knative require it to exist).
	_, err = client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return e
}

// front is the webhook's one listener. Its serving certificate source
// switches from the old tool's to evercert's replicas at the switch,
// standing in for a rolling Deployment behind a Service: the kube-apiserver
// dials one address throughout.
type front struct {
	port   int
	source atomic.Pointer[func(*tls.ClientHelloInfo) (*tls.Certificate, error)]
}

func startFront(t *testing.T) *front {
	t.Helper()
	f := &front{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f.port = ln.Addr().(*net.TCPAddr).Port
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		src := f.source.Load()
		if src == nil {
			return nil, errors.New("no serving certificate source yet")
		}
		return (*src)(h)
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("/validate", admit)
	srv := &http.Server{Handler: mux, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return f
}

func (f *front) use(src func(*tls.ClientHelloInfo) (*tls.Certificate, error)) { f.source.Store(&src) }

// admit allows every review.
func admit(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "bad review", http.StatusBadRequest)
		return
	}
	review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}

// load creates ConfigMaps in ns, one after the other, so the
// kube-apiserver calls the webhook continuously, and counts the failures.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	stop       func()
}

// waitForWebhook waits until a call through the webhook succeeds: the old
// tool serves and its caBundle is injected.
func (e *env) waitForWebhook() {
	e.t.Helper()
	var last error
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if last = e.call(); last == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.t.Fatalf("the webhook never answered through the old tool: %v", last)
}

func (e *env) call() error {
	_, err := e.client.CoreV1().ConfigMaps(ns).Create(e.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "call-"}}, metav1.CreateOptions{})
	return err
}

func (e *env) startLoad() *load {
	l := &load{}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	l.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := e.call(); err != nil && ctx.Err() == nil {
				l.failed.Add(1)
				l.mu.Lock()
				if len(l.errs) < 5 {
					l.errs = append(l.errs, err.Error())
				}
				l.mu.Unlock()
			} else if err == nil {
				l.ok.Add(1)
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	e.load = l
	return l
}

// counts returns the calls so far, ok and failed.
func (l *load) counts() (int64, int64) { return l.ok.Load(), l.failed.Load() }

func (l *load) errors() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.errs, "; ")
}

// replica is one evercert replica: its own Authority, cabundle.Publisher
// and serving provider (the Authority's leaf).
type replica struct {
	a *authority.Authority
	p *cabundle.Publisher
}

// startReplicas starts n evercert replicas adopting the Secret in layout.
// Lifetimes are short so that the first observed CA rotation happens
// within about a minute: a 60s leaf, an 8 min CA, a successor published
// 160s before the signing CA ends (at once for the old tools' 3 min CAs),
// signing 35s after it was published, once every replica and every
// replica's caBundle publisher confirmed it.
func (e *env) startReplicas(n int, layout authority.SecretLayout) []*replica {
	e.t.Helper()
	var rs []*replica
	for i := range n {
		id := fmt.Sprintf("r%d", i)
		client := kubernetes.NewForConfigOrDie(e.cluster.Config())
		a, err := authority.New(authority.Config{
			Name: "authority-" + id, Namespace: ns, SecretName: secretName, Client: client,
			Hosts: []string{dnsName}, Lifetime: time.Minute, ReplicaID: id,
			Adopt: layout, DisableCreate: true,
		})
		require.NoError(e.t, err)
		p, err := cabundle.NewPublisher(cabundle.PublisherConfig{
			Name: "cabundle-" + id, Source: a, KubeConfig: e.cluster.Config(),
			Targets: []cabundle.Target{{Kind: cabundle.ValidatingWebhookConfiguration, Name: vwcName}},
		})
		require.NoError(e.t, err)
		a.AddObserver(p)
		ctx, cancel := context.WithCancel(e.ctx)
		var wg sync.WaitGroup
		wg.Go(func() { a.Run(ctx, 1) })
		wg.Go(func() { p.Run(ctx, 1) })
		e.t.Cleanup(func() { cancel(); wg.Wait() })
		rs = append(rs, &replica{a: a, p: p})
	}
	return rs
}

// switchTo makes the front serve the replicas' leaves, round robin, once
// every replica has one.
func (e *env) switchTo(rs []*replica) {
	e.t.Helper()
	waitUntil(e.t, "every replica's leaf", 2*time.Minute, func() bool {
		for _, r := range rs {
			if r.a.Leaf() == nil {
				return false
			}
		}
		return true
	})
	var next atomic.Uint64
	e.front.use(func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		r := rs[next.Add(1)%uint64(len(rs))]
		_, _, c := r.a.CurrentParsedCertKeyContent()
		if c == nil {
			return nil, errors.New("replica has no leaf")
		}
		return c, nil
	})
}

// waitForRotation waits until every replica signs with a CA other than
// old, serves a leaf of it, and the webhook configuration trusts it, then
// lets 20 more calls go through the new leaves.
func (e *env) waitForRotation(rs []*replica, old *x509.Certificate) {
	e.t.Helper()
	waitUntil(e.t, "the first observed CA rotation after the switch", 4*time.Minute, func() bool {
		for _, r := range rs {
			st := r.a.Status()
			leaf := r.a.Leaf()
			if st.Signing.Fingerprint == authority.Fingerprint(old) || leaf == nil || leaf.Issuer.CommonName != st.Signing.CommonName {
				return false
			}
		}
		return true
	})
	for _, r := range rs {
		require.Zero(e.t, r.a.Status().UnsafeRotations, "%s rotated unsafely", r.a.Name())
	}
	ok, _ := e.load.counts()
	waitUntil(e.t, "20 calls through the new leaves", time.Minute, func() bool { n, _ := e.load.counts(); return n >= ok+20 })
}

// caBundle returns the webhook configuration's caBundle.
func (e *env) caBundle() []byte {
	vwc, err := e.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(e.ctx, vwcName, metav1.GetOptions{})
	require.NoError(e.t, err)
	return vwc.Webhooks[0].ClientConfig.CABundle
}

// injectCABundle writes ca into every webhook of the configuration, with
// an Update carrying the resourceVersion read, as cert-manager's cainjector
// and knative's webhook reconciler do.
func (e *env) injectCABundle(ca []byte) error {
	vwcs := e.client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	vwc, err := vwcs.Get(e.ctx, vwcName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	changed := false
	for i := range vwc.Webhooks {
		if !bytes.Equal(vwc.Webhooks[i].ClientConfig.CABundle, ca) {
			vwc.Webhooks[i].ClientConfig.CABundle, changed = ca, true
		}
	}
	if !changed {
		return nil
	}
	_, err = vwcs.Update(e.ctx, vwc, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil // re-read on the next round
	}
	return err
}

// migrate runs the switch: the old tool is stopped (stopOld), evercert
// replicas adopt its Secret, the front switches to them, and the first
// observed CA rotation runs, all while the load calls the webhook. It
// logs and checks the failed calls of each phase.
func (e *env) migrate(tool string, layout authority.SecretLayout, stopOld func()) {
	e.t.Helper()
	secret, err := e.client.CoreV1().Secrets(ns).Get(e.ctx, secretName, metav1.GetOptions{})
	require.NoError(e.t, err)
	oldBundle := e.caBundle()
	require.NotEmpty(e.t, oldBundle, "%s injected no caBundle", tool)
	old := oldCA(e.t, tool, secret)

	l := e.startLoad()
	waitUntil(e.t, "calls through the old tool", time.Minute, func() bool { n, _ := l.counts(); return n >= 20 })
	okBefore, failedBefore := l.counts()
	stopOld()
	rs := e.startReplicas(2, layout)
	e.switchTo(rs)
	okSwitch, failedSwitch := l.counts()
	e.waitForRotation(rs, old)
	l.stop()
	okAll, failedAll := l.counts()

	after, err := e.client.CoreV1().Secrets(ns).Get(e.ctx, secretName, metav1.GetOptions{})
	require.NoError(e.t, err)
	require.Contains(e.t, string(after.Data["ca.crt"]), string(pemOf(old)), "%s's CA left ca.crt before it expired", tool)
	require.Contains(e.t, string(e.caBundle()), string(pemOf(old)), "%s's CA left the caBundle before it expired", tool)
	e.t.Logf("%s migration: calls through %s before the switch: %d ok, %d failed; from stopping %s to evercert serving: %d ok, %d failed; through the first observed CA rotation: %d ok, %d failed; total %d ok, %d failed",
		tool, tool, okBefore, failedBefore, tool, okSwitch-okBefore, failedSwitch-failedBefore, okAll-okSwitch, failedAll-failedSwitch, okAll, failedAll)
	require.Zero(e.t, failedAll, "failed webhook calls: %s", l.errors())
}

func oldCA(t *testing.T, tool string, s *corev1.Secret) *x509.Certificate {
	t.Helper()
	key := map[string]string{"cert-controller": "ca.crt", "cert-manager": "tls.crt", "knative": "ca-cert.pem"}[tool]
	certs := parsePEM(t, s.Data[key])
	require.Len(t, certs, 1, "%s's CA (%s)", tool, key)
	return certs[0]
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// statusOf is one RotationStatus as a RotationReporter, so that readiness
// is judged on the status the test just looked at.
type statusOf struct {
	name string
	st   authority.RotationStatus
}

func (s statusOf) Name() string                     { return s.name }
func (s statusOf) Status() authority.RotationStatus { return s.st }

// migrateWhileOldRuns is migrate with the old tool still running while the
// replicas start, as a rolling update straight from the old tool's pods
// does: for overlap, the old tool keeps writing its Secret (rewrites
// counts its rewrites) and its caBundle, the front keeps serving the old
// pods (as a Service does until the rollout moves on), and every replica
// must report the other writer (Stalled, ForeignWriter) while its
// readiness check stays green, without ca.crt growing. Then the old
// tool stops (stopOld), the replicas adopt its last CA once and are ready
// again, the front switches to them and the first observed CA rotation
// runs. 0 failed calls from the old tool's stop on (the overlap's are
// logged; see below). At the end ca.crt holds only what a rule of
// docs/migrating.md keeps: the signing CA and its successor, the old
// tool's last CA (its pods served its leaf to the end), the CA the
// replicas signed with when the overlap began (kept until it expires, as
// after any adoption), and CAs kept for a leaf served during the last
// episode, each with its retirement recorded (evercert.io/retire-after).
// old reports how often the old tool rewrote the Secret so far and the CA
// it wrote last.
func (e *env) migrateWhileOldRuns(tool string, layout authority.SecretLayout, overlap time.Duration, old func() (int64, *x509.Certificate), stopOld func()) {
	e.t.Helper()
	require.NotEmpty(e.t, e.caBundle(), "%s injected no caBundle", tool)
	l := e.startLoad()
	waitUntil(e.t, "calls through the old tool", time.Minute, func() bool { n, _ := l.counts(); return n >= 20 })
	okBefore, failedBefore := l.counts()
	rewritesBefore, _ := old()

	rs := e.startReplicas(2, layout)
	reported := map[string]string{}
	// anchors are the CAs the replicas signed with when they first held:
	// the CA signed with when the overlap began, which stays until it
	// expires (a replica cut off since renews from it). cert-controller's
	// and cert-manager's first CA; with knative, whose CA has no key, the
	// first of evercert's own.
	anchors := map[string]bool{}
	maxCAs := 0
	for end := time.Now().Add(overlap); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		for _, r := range rs {
			// The hold is reported in Status (ForeignWriter, Stalled),
			// not by readiness: a rolling update removes the old pods
			// only once the new ones are Ready.
			if st := r.a.Status(); st.ForeignWriter != "" {
				if reported[r.a.Name()] == "" {
					anchors[st.Signing.Fingerprint] = true
				}
				reported[r.a.Name()] = st.ForeignWriter
				require.True(e.t, st.Stalled, "%s: Stalled while %s keeps writing", r.a.Name(), tool)
				// Readiness of this very status: a second Status() may
				// already be past the hold (adopted once, catching up),
				// which the conditions here do not excuse.
				if r.a.Leaf() != nil && !st.LeafExpired && st.ClockSkew == "" && !st.CatchingUp {
					require.NoError(e.t, authority.RotationCheck(statusOf{r.a.Name(), st}).Check(nil), "%s: ready while %s keeps writing and a valid leaf is served; status %+v", r.a.Name(), tool, st)
				}
			}
			maxCAs = max(maxCAs, len(parsePEM(e.t, r.a.CurrentCABundleContent())))
		}
		s, err := e.client.CoreV1().Secrets(ns).Get(e.ctx, secretName, metav1.GetOptions{})
		require.NoError(e.t, err)
		if len(s.Data["ca.crt"]) > 0 {
			maxCAs = max(maxCAs, len(parsePEM(e.t, s.Data["ca.crt"])))
		}
	}
	rewritesAfter, _ := old()
	rewritten := rewritesAfter - rewritesBefore
	require.Positive(e.t, rewritten, "%s never rewrote the Secret during the overlap", tool)
	for _, r := range rs {
		require.Contains(e.t, reported[r.a.Name()], "another writer keeps rewriting", "%s never reported %s's rewrites", r.a.Name(), tool)
	}
	okOverlap, failedOverlap := l.counts()

	stopOld()
	// The old tool's last CA: its pods served a leaf of it to the end.
	_, lastOld := old()
	waitUntil(e.t, "the replicas to adopt the Secret once the old tool stopped, and be ready", 3*time.Minute, func() bool {
		for _, r := range rs {
			if r.a.Leaf() == nil || authority.RotationCheck(r.a).Check(nil) != nil {
				return false
			}
		}
		s, err := e.client.CoreV1().Secrets(ns).Get(e.ctx, secretName, metav1.GetOptions{})
		require.NoError(e.t, err)
		_, cc := s.Data["ca.key"]
		return !cc && !bytes.Equal(s.Data["tls.crt"], s.Data["ca.crt"]) // evercert's layout, no other writer's
	})
	e.switchTo(rs)
	okSwitch, failedSwitch := l.counts()
	e.waitForRotation(rs, lastOld)
	l.stop()
	okAll, failedAll := l.counts()

	after, err := e.client.CoreV1().Secrets(ns).Get(e.ctx, secretName, metav1.GetOptions{})
	require.NoError(e.t, err)
	cas := parsePEM(e.t, after.Data["ca.crt"])
	n := len(cas)
	// When each CA kept for a served leaf leaves ca.crt (the trim's
	// record), and which CA each replica's leaf chains to: what a CA in
	// ca.crt at the end is kept for.
	retire := map[string]string{}
	for entry := range strings.SplitSeq(after.Annotations[authority.RetireAfterAnnotation], ",") {
		if fp, at, ok := strings.Cut(entry, "="); ok {
			retire[fp] = at
		}
	}
	for _, c := range cas {
		e.t.Logf("%s migration with %s still writing: ca.crt at the end (%s) holds %q serial %x, valid %s to %s, retire-after %q", tool, tool, time.Now().UTC().Format(time.RFC3339), c.Subject.CommonName, c.SerialNumber, c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339), retire[authority.Fingerprint(c)])
	}
	for _, r := range rs {
		if leaf := r.a.Leaf(); leaf != nil {
			for _, c := range cas {
				if leaf.CheckSignatureFrom(c) == nil {
					e.t.Logf("%s migration with %s still writing: %s serves a leaf until %s of %q serial %x", tool, tool, r.a.Name(), leaf.NotAfter.Format(time.RFC3339), c.Subject.CommonName, c.SerialNumber)
				}
			}
		}
	}
	if failedAll > 0 {
		e.t.Logf("%s migration with %s still writing: the first failed calls: %s", tool, tool, l.errors())
	}
	e.t.Logf("%s migration with %s still writing: %d rewrites by %s in the overlap, at most %d CAs in a bundle then, %d in ca.crt at the end; calls before the replicas started: %d ok, %d failed; during the overlap: %d ok, %d failed; from stopping %s to evercert serving: %d ok, %d failed; through the first observed CA rotation: %d ok, %d failed; total %d ok, %d failed",
		tool, tool, rewritten, tool, maxCAs, n, okBefore, failedBefore, okOverlap-okBefore, failedOverlap-failedBefore, tool, okSwitch-okOverlap, failedSwitch-failedOverlap, okAll-okSwitch, failedAll-failedSwitch, okAll, failedAll)
	retiring := after.Annotations[authority.RetireAfterAnnotation]
	keptForGood := func(s *corev1.Secret, c *x509.Certificate) bool {
		return bytes.Equal(pemOf(c), s.Data["tls.crt"]) || bytes.Equal(pemOf(c), s.Data[authority.NextCertKey]) || c.Equal(lastOld) || anchors[authority.Fingerprint(c)]
	}
	var due time.Time
	for _, c := range cas {
		if !keptForGood(after, c) {
			require.Contains(e.t, retiring, authority.Fingerprint(c), "ca.crt holds CA %q (valid %s to %s), which no rule keeps: neither signing nor the successor, the old tool's last CA, the one signed with when the overlap began, nor one kept for a served leaf with its retirement recorded",
				c.Subject.CommonName, c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339))
			if t, err := time.Parse(time.RFC3339, retire[authority.Fingerprint(c)]); err == nil && t.After(due) {
				due = t
			}
		}
	}
	// Once each recorded retirement is due (a leaf lifetime and a check
	// interval after its trim), the CAs kept for a served leaf leave, and
	// ca.crt holds the CAs a rule keeps for good: at most the signing CA,
	// its successor, the old tool's last CA and the one signed with when
	// the overlap began. Compared before they could expire: the old
	// tools' CAs here live three minutes.
	waitUntil(e.t, "the CAs kept for a served leaf to leave ca.crt once their retirement is due", max(time.Until(due), 0)+time.Minute, func() bool {
		s, err := e.client.CoreV1().Secrets(ns).Get(e.ctx, secretName, metav1.GetOptions{})
		require.NoError(e.t, err)
		for _, c := range parsePEM(e.t, s.Data["ca.crt"]) {
			if !keptForGood(s, c) {
				return false
			}
		}
		return true
	})
	final, err := e.client.CoreV1().Secrets(ns).Get(e.ctx, secretName, metav1.GetOptions{})
	require.NoError(e.t, err)
	e.t.Logf("%s migration with %s still writing: %d CAs in ca.crt once the retirements were due (%s)", tool, tool, len(parsePEM(e.t, final.Data["ca.crt"])), due.UTC().Format(time.RFC3339))
	require.LessOrEqual(e.t, len(parsePEM(e.t, final.Data["ca.crt"])), 4, "ca.crt keeps only the CAs a served leaf needs")
	// During a hold a bundle holds the CAs the last trim kept (the signing
	// CA, the one signed with when the overlap began, the ones a replica
	// still serves a leaf of: keepOldLeaf keeps a leaf for the
	// propagation delay), a successor, and the old tool's current CA, never
	// one per rewrite: measured 5 in three runs.
	require.LessOrEqual(e.t, maxCAs, 6, "no bundle grows with the old tool's rewrites (at most the kept CAs, a successor and the old tool's current CA)")
	require.Contains(e.t, string(after.Data["ca.crt"]), string(pemOf(lastOld)), "%s's last CA left ca.crt before it expired", tool)
	require.Zero(e.t, failedAll-failedOverlap, "failed webhook calls once %s stopped: %s", tool, l.errors())
	// The calls that fail during the overlap are logged above, not
	// checked: the old tool answers evercert's adoptions (the first one,
	// then one per backed-off quiet period) with a new CA that it swaps
	// into the caBundle alone, while its pods serve the leaf of the CA
	// before until their mount catches up, so calls in flight then fail
	// whatever evercert does (cert-controller's and cert-manager's own
	// rotations do that too). That evercert's published bundle keeps the
	// old pods' CA is TestAdoptWhileOldRotatorStillWrites's.
}
