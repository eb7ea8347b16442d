package cabundle

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsfake "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/fake"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	aggregatorfake "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset/fake"

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
	for _, r := range []string{resultSuccess, resultUnchanged, resultConflict, resultError, resultContested, resultReplicaAhead} {
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

// recordedEvent is one Event a testRecorder received.
type recordedEvent struct {
	kind, name, eventtype, reason, action, note string
}

// testRecorder is an events.EventRecorder that keeps what it receives. It
// never blocks, unlike events.FakeRecorder with a full channel.
type testRecorder struct {
	mu     sync.Mutex
	events []recordedEvent
}

var _ events.EventRecorder = &testRecorder{}

func (r *testRecorder) Eventf(regarding, _ k8sruntime.Object, eventtype, reason, action, note string, args ...any) {
	e := recordedEvent{eventtype: eventtype, reason: reason, action: action, note: fmt.Sprintf(note, args...)}
	if ref, ok := regarding.(*corev1.ObjectReference); ok {
		e.kind, e.name = ref.Kind, ref.Name
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// find returns the events with reason.
func (r *testRecorder) find(reason string) []recordedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []recordedEvent
	for _, e := range r.events {
		if e.reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// await returns the events with reason once there is at least one. The
// publisher makes its state visible (Contested, health, gauges) before it
// sends the Event about it, so a test that saw the state must wait for the
// Event rather than read it at once; it waits on the wall clock, bounded.
func (r *testRecorder) await(t testing.TB, reason string) []recordedEvent {
	t.Helper()
	eventually(t, 10*time.Second, "an Event with reason "+reason, func() bool { return len(r.find(reason)) > 0 })
	return r.find(reason)
}

// competitor simulates another writer of a MutatingWebhookConfiguration's
// caBundle (Helm, cainjector, OLM): it watches the object and, every time
// the first webhook's caBundle is not its own, writes its own back with an
// update under its own field manager.
type competitor struct {
	cancel   context.CancelFunc
	done     chan struct{}
	rewrites atomic.Int64 // updates it made
	sawOurs  atomic.Int64 // events in which the caBundle held the other bundle
}

func startCompetitor(t testing.TB, client kubernetes.Interface, name string, theirs []byte, manager string) *competitor {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mwcs := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	w, err := mwcs.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		cancel()
		t.Fatalf("competitor: watch: %v", err)
	}
	c := &competitor{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer w.Stop()
		for {
			var ev watch.Event
			var ok bool
			select {
			case <-ctx.Done():
				return
			case ev, ok = <-w.ResultChan():
				if !ok {
					return
				}
			}
			o, isMWC := ev.Object.(*admissionregistrationv1.MutatingWebhookConfiguration)
			if !isMWC || o.Name != name || len(o.Webhooks) == 0 || bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, theirs) {
				continue
			}
			c.sawOurs.Add(1)
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, err := mwcs.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if bytes.Equal(cur.Webhooks[0].ClientConfig.CABundle, theirs) {
					return nil
				}
				cur.Webhooks[0].ClientConfig.CABundle = theirs
				_, err = mwcs.Update(ctx, cur, metav1.UpdateOptions{FieldManager: manager})
				if err == nil {
					c.rewrites.Add(1)
				}
				return err
			})
			if err != nil && ctx.Err() == nil {
				t.Logf("competitor: update: %v", err)
			}
		}
	}()
	t.Cleanup(c.stop)
	return c
}

// stop stops the competitor and waits until it made its last write.
func (c *competitor) stop() {
	c.cancel()
	<-c.done
}

// settle gives the goroutines a fake-clock step woke up the chance to run:
// it returns once count has not changed for a few milliseconds (or after
// 100 ms of real time). It is pacing for fake-clock tests, not an
// assertion: returning early only means simulated time runs ahead of the
// publisher's work, which no assertion depends on.
func settle(count func() int) {
	last, stable := count(), 0
	for range 100 {
		if stable >= 3 {
			return
		}
		time.Sleep(time.Millisecond)
		if n := count(); n == last {
			stable++
		} else {
			last, stable = n, 0
		}
	}
}

// mutatingWithBundle is a MutatingWebhookConfiguration with one webhook for
// service ns1/svc1 holding bundle.
func mutatingWithBundle(name string, bundle []byte) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "w.example.com",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: "ns1", Name: "svc1"},
				CABundle: bundle,
			},
		}},
	}
}

// maxContestedWrites is the most writes the contested backoff allows within
// d after an object became contested: one per delay, with every delay at
// its shortest (no jitter).
func maxContestedWrites(d time.Duration) int {
	n, at, delay := 0, time.Duration(0), contestInitialDelay
	for {
		at += delay
		if at > d {
			return n
		}
		n++
		delay = min(2*delay, contestMaxDelay)
	}
}

// adapterOf builds the adapter of kind through the registry of kinds, on
// fake clients that nothing is sent to.
func adapterOf(t *testing.T, kind Kind) *kindAdapter {
	t.Helper()
	build, ok := kinds[kind]
	if !ok {
		t.Fatalf("kind %s is not registered", kind)
	}
	a, err := build(&clients{cfg: &PublisherConfig{
		KubeClient: kubefake.NewClientset(), APIExtensionsClient: apiextensionsfake.NewClientset(), AggregatorClient: aggregatorfake.NewClientset(),
	}})
	if err != nil {
		t.Fatalf("building the adapter of %s: %v", kind, err)
	}
	if a.kind != kind {
		t.Fatalf("the registry builds a %s adapter for kind %s", a.kind, kind)
	}
	return a
}
