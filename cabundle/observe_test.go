package cabundle

import (
	"context"
	"crypto/x509"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
)

// valve holds watch events back while closed.
type valve struct {
	mu   sync.Mutex
	open chan struct{} // closed while the valve is open
}

func newValve() *valve { return &valve{open: make(chan struct{})} }

func (v *valve) set(open bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.open:
		if !open {
			v.open = make(chan struct{})
		}
	default:
		if open {
			close(v.open)
		}
	}
}

func (v *valve) wait() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.open
}

// valveWatch forwards the events of inner only while its valve is open.
type valveWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func newValveWatch(inner watch.Interface, v *valve) *valveWatch {
	w := &valveWatch{inner: inner, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(w.out)
		for ev := range inner.ResultChan() {
			select {
			case <-v.wait():
			case <-w.stop:
				return
			}
			select {
			case w.out <- ev:
			case <-w.stop:
				return
			}
		}
	}()
	return w
}

func (w *valveWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *valveWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.inner.Stop()
	})
}

// countingListener counts Enqueue calls.
type countingListener struct{ n atomic.Int64 }

func (l *countingListener) Enqueue() { l.n.Add(1) }

func parseCA(t *testing.T, bundle []byte) *x509.Certificate {
	t.Helper()
	certs, err := pki.ParseCABundle(bundle)
	if err != nil || len(certs) != 1 {
		t.Fatalf("parse CA: %v", err)
	}
	return certs[0]
}

// TestObservedFollowsReadBack checks the publisher as a
// authority.Observer: Observed is true only once the informer has seen
// the written object holding the CA (not when the write succeeded), false
// again when someone wipes the caBundle, and listeners hear of each change.
func TestObservedFollowsReadBack(t *testing.T) {
	ctx := context.Background()
	bundle := newBundle(t, "observed")
	ca := parseCA(t, bundle)
	other := parseCA(t, newBundle(t, "other"))
	const name = "observed"
	key := objectKey(MutatingWebhookConfiguration, name)
	f := fakeClients{kube: kubefake.NewClientset(mutatingWithBundle(name, nil))}
	mwcs := f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations()

	// The informer's watch delivers events only while the valve is open;
	// its initial list is not held back.
	events := newValve()
	f.kube.PrependWatchReactor("mutatingwebhookconfigurations", func(a clienttesting.Action) (bool, watch.Interface, error) {
		inner, err := f.kube.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		return true, newValveWatch(inner, events), nil
	})
	var denyPatches atomic.Bool
	f.kube.PrependReactor("patch", "mutatingwebhookconfigurations", func(clienttesting.Action) (bool, k8sruntime.Object, error) {
		if denyPatches.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations"},
				name, errors.New("not now"))
		}
		return false, nil, nil
	})

	clk := clocktesting.NewFakeClock(fakeStart)
	cfg := f.config(newTestCA(bundle), false, Target{Kind: MutatingWebhookConfiguration, Name: name})
	cfg.Clock, cfg.Name = clk, "webhook-cabundle"
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var obs authority.Observer = p
	if obs.Name() != "webhook-cabundle" || p.HealthCheck().Name() != "webhook-cabundle" {
		t.Errorf("names %q, %q, want PublisherConfig.Name", obs.Name(), p.HealthCheck().Name())
	}
	l := &countingListener{}
	p.AddListener(l)
	if obs.Observed(ca) {
		t.Error("Observed before Run")
	}
	if got := p.Pending(ca); !reflect.DeepEqual(got, []string{key}) {
		t.Errorf("Pending before Run = %v, want [%s]", got, key)
	}

	runPublisher(t, p)
	// The write succeeded, but no watch event has told the informer.
	waitReady(t, p, 10*time.Second)
	if o, _ := mwcs.Get(ctx, name, metav1.GetOptions{}); len(o.Webhooks[0].ClientConfig.CABundle) == 0 {
		t.Fatal("not written")
	}
	if obs.Observed(ca) {
		t.Error("Observed after the write but before the informer read it back")
	}
	if got := p.Pending(ca); !reflect.DeepEqual(got, []string{key}) {
		t.Errorf("Pending = %v, want [%s]", got, key)
	}

	n := l.n.Load()
	events.set(true)
	eventually(t, 10*time.Second, "observed once read back", func() bool { return obs.Observed(ca) })
	if l.n.Load() <= n {
		t.Error("listeners not notified when the CA was read back")
	}
	if len(p.Pending(ca)) != 0 || obs.Observed(other) {
		t.Errorf("Pending(ca) = %v, Observed(other CA) = %v", p.Pending(ca), obs.Observed(other))
	}

	// Someone wipes the caBundle while the publisher cannot write.
	denyPatches.Store(true)
	n = l.n.Load()
	o, err := mwcs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o.Webhooks[0].ClientConfig.CABundle = nil
	if _, err := mwcs.Update(ctx, o, metav1.UpdateOptions{FieldManager: "someone"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "not observed once wiped", func() bool { return !obs.Observed(ca) })
	if l.n.Load() <= n {
		t.Error("listeners not notified when the caBundle was wiped")
	}
	if got := p.Pending(ca); !reflect.DeepEqual(got, []string{key}) {
		t.Errorf("Pending after the wipe = %v, want [%s]", got, key)
	}

	// Writes work again: the retry (on the fake clock) repairs it.
	denyPatches.Store(false)
	for !obs.Observed(ca) {
		if clk.Since(fakeStart) > time.Minute {
			t.Fatal("not observed again within a simulated minute of writes working again")
		}
		clk.Step(time.Second)
		settle(func() int { return len(f.kube.Actions()) })
	}
}

// TestObservedIgnoresWhatCannotBlock: missing objects and objects with
// nothing to publish to do not block; every selected field must hold the
// CA, unselected ones need not.
func TestObservedIgnoresWhatCannotBlock(t *testing.T) {
	bundle := newBundle(t, "ca")
	ca := parseCA(t, bundle)
	vwc := vwcFixture(nil, nil)
	vwc.ResourceVersion = ""
	f := fakeClients{kube: kubefake.NewClientset(vwc,
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "empty"}})}
	p, err := NewPublisher(f.config(newTestCA(bundle), false,
		Target{Kind: ValidatingWebhookConfiguration, Name: "vwc", Service: &ServiceRef{Namespace: "ns1", Name: "svc1"}},
		Target{Kind: MutatingWebhookConfiguration, Name: "empty"},
		Target{Kind: MutatingWebhookConfiguration, Name: "missing"},
	))
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	// The two svc1 webhooks get the bundle; the other-service and URL
	// webhooks of the same object do not, and need not.
	eventually(t, 10*time.Second, "observed", func() bool { return p.Observed(ca) })
	if got := p.Pending(ca); len(got) != 0 {
		t.Errorf("Pending = %v", got)
	}
	if p.Observed(nil) {
		t.Error("Observed(nil)")
	}
}
