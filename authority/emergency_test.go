package authority_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/apitest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// emergencyGuard bounds every real-time wait of these tests.
const emergencyGuard = 60 * time.Second

// emergencyWorld is three Authority replicas, each serving its leaf on
// 127.0.0.1 through a real TLS listener, and a caBundle publisher (in
// replica 0, observing its rotation, as example/webhook runs it) writing a
// ValidatingWebhookConfiguration, all with their real Run loops on one fake
// clock and one fake API server that enforces resourceVersions.
type emergencyWorld struct {
	t        *testing.T
	client   *fake.Clientset
	clk      *clocktesting.FakeClock
	mu       sync.Mutex // guards replicas and stops (restart)
	replicas []*authority.Authority
	stops    []func()
	addrs    []string
	failed   atomic.Int64 // handshakes of a bundle-following client that failed
	// stale counts handshakes that failed because the follower's copy of
	// the caBundle was replaced while it called (the emergency window);
	// each was retried with the current bundle.
	stale atomic.Int64
}

func newEmergencyWorld(t *testing.T) *emergencyWorld { return newEmergencyWorldWith(t, nil) }

// newEmergencyWorldWith is newEmergencyWorld with setup called on the fake
// client before any replica starts (reactors: RBAC, faults).
func newEmergencyWorldWith(t *testing.T, setup func(*fake.Clientset)) *emergencyWorld {
	w := &emergencyWorld{t: t, client: fake.NewClientset(), clk: clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))}
	enforceResourceVersions(w.client)
	if setup != nil {
		setup(w.client)
	}
	_, err := w.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(context.Background(), &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "wh"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "wh.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "wh"}},
			SideEffects: ptrTo(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	for r := range 3 {
		w.replicas = append(w.replicas, nil)
		w.stops = append(w.stops, nil)
		w.start(r)
		w.addrs = append(w.addrs, tlstest.Server(t, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			_, _, c := w.replica(r).CurrentParsedCertKeyContent()
			if c == nil {
				return nil, errors.New("no leaf yet")
			}
			return c, nil
		}}))
	}
	// Steady state: the first CA published and every replica serving it.
	for range 20 {
		w.step(time.Second)
	}
	w.await("the first CA published", func() bool { return len(w.published()) > 0 })
	return w
}

// start runs replica r (replica 0 with the caBundle publisher) in a new
// process of its own, under its stable ReplicaID, and waits for its leaf.
func (w *emergencyWorld) start(r int) {
	w.t.Helper()
	a, err := authority.New(authority.Config{
		Name: fmt.Sprintf("emergency-r%d", r), Namespace: "ns", SecretName: "ca", Client: w.client,
		ReplicaID: fmt.Sprintf("r%d", r), Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: w.clk,
	})
	require.NoError(w.t, err)
	var stops []func()
	if r == 0 {
		p, err := cabundle.NewPublisher(cabundle.PublisherConfig{
			Source: a, KubeClient: w.client, Clock: w.clk,
			Targets: []cabundle.Target{{Kind: cabundle.ValidatingWebhookConfiguration, Name: "wh"}},
		})
		require.NoError(w.t, err)
		a.AddObserver(p)
		stops = append(stops, background(w.t, p.Run))
	}
	stops = append(stops, background(w.t, a.Run))
	w.mu.Lock()
	w.replicas[r] = a
	w.stops[r] = func() {
		for _, stop := range stops {
			stop()
		}
	}
	w.mu.Unlock()
	w.await("replica's first leaf", func() bool { return a.Leaf() != nil })
}

// restart stops replica r's process (its Run loops return) and starts a
// new one: what it learned in memory is gone.
func (w *emergencyWorld) restart(r int) {
	w.t.Helper()
	w.mu.Lock()
	stop := w.stops[r]
	w.mu.Unlock()
	stop()
	w.start(r)
}

func (w *emergencyWorld) replica(r int) *authority.Authority {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.replicas[r]
}

func ptrTo[T any](v T) *T { return &v }

// background runs run until the test ends or the returned stop is
// called, whichever is first; either waits for run to return.
func background(t *testing.T, run func(context.Context, int)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, 1)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(emergencyGuard):
				t.Error("Run did not return after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// await polls cond until it holds, failing the test after emergencyGuard.
func (w *emergencyWorld) await(what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(emergencyGuard)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// settle waits until the replicas and the publisher stopped talking to the
// fake API server and the clock's waiters stayed the same over consecutive
// looks: the events of the last step have been handled. The test's own
// reads go through the tracker (apitest.Get) and are not actions, so a
// follower calling the replicas meanwhile does not keep it from settling.
func (w *emergencyWorld) settle() {
	w.t.Helper()
	stable, last := 0, ""
	deadline := time.Now().Add(emergencyGuard)
	for stable < 30 {
		if time.Now().After(deadline) {
			w.t.Fatalf("never settled: %s actions/waiters (want %d waiters); %s", last, 2*len(w.replicas), apitest.Recent(w.client.Actions(), apitest.RecentWindow))
		}
		time.Sleep(200 * time.Microsecond)
		state := fmt.Sprint(len(w.client.Actions()), "/", w.clk.Waiters())
		if state == last && w.clk.Waiters() >= 2*len(w.replicas) {
			stable++
		} else {
			stable = 0
		}
		last = state
	}
}

// step moves the clock, lets everything settle, and checks that a client
// following the published caBundle reaches every replica.
func (w *emergencyWorld) step(d time.Duration) {
	w.clk.Step(d)
	w.settle()
	w.followerHandshakes()
}

// webhook reads the webhook configuration as a client does, from the
// tracker: the test's reads are not the replicas' requests.
func (w *emergencyWorld) webhook() *admissionregistrationv1.ValidatingWebhookConfiguration {
	o, err := apitest.Get[*admissionregistrationv1.ValidatingWebhookConfiguration](w.client.Tracker(), admissionregistrationv1.SchemeGroupVersion.WithResource("validatingwebhookconfigurations"), "", "wh")
	require.NoError(w.t, err)
	return o
}

// published is the caBundle of the webhook, as a client reads it.
func (w *emergencyWorld) published() []byte {
	return w.webhook().Webhooks[0].ClientConfig.CABundle
}

func (w *emergencyWorld) secret() *corev1.Secret {
	s, err := apitest.Get[*corev1.Secret](w.client.Tracker(), corev1.SchemeGroupVersion.WithResource("secrets"), "ns", "ca")
	require.NoError(w.t, err)
	return s
}

// followerHandshakes handshakes with every replica, trusting the caBundle
// published now; failures are counted.
//
// In an emergency the successor signs without the propagation delay, so a
// client whose copy of the caBundle predates the successor's publication
// fails: the window the README documents. The follower reads the bundle,
// then calls three replicas; a replica may have moved to the successor in
// between. So a chain that the follower's copy does not verify is checked
// once more, inside the same handshake, against the bundle published by the
// time the replica sent it: if that verifies it, the replica served a
// published CA and only the follower's copy was stale (counted apart, in
// stale); if not, the replica served a CA that was not published, a
// failure.
func (w *emergencyWorld) followerHandshakes() {
	bundle := w.published()
	if len(bundle) == 0 {
		return // nothing published yet: no client can call
	}
	for n, addr := range w.addrs {
		_, err := tlstest.HandshakeState(addr, &tls.Config{
			ServerName: "localhost", Time: w.clk.Now,
			// Verification is done in VerifyConnection, against the
			// follower's copy and then the current bundle, as above.
			InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				err := w.verify(cs.PeerCertificates, bundle)
				if err == nil {
					return nil
				}
				if now := w.published(); !bytes.Equal(now, bundle) && w.verify(cs.PeerCertificates, now) == nil {
					w.stale.Add(1)
					return nil
				}
				return err
			},
		})
		if err != nil {
			w.failed.Add(1)
			w.t.Errorf("at %s a client following the published caBundle failed to reach replica %d: %v", w.clk.Now().UTC().Format(time.RFC3339), n, err)
		}
	}
}

// verify checks a served chain for localhost as crypto/tls does, against
// the CAs in bundle, at the fake clock's time.
func (w *emergencyWorld) verify(chain []*x509.Certificate, bundle []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return errors.New("the bundle holds no certificate")
	}
	if len(chain) == 0 {
		return errors.New("the server sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{DNSName: "localhost", Roots: pool, Intermediates: inter, CurrentTime: w.clk.Now()})
	return err
}

func (w *emergencyWorld) handshake(addr string, bundle []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return errors.New("the bundle holds no certificate")
	}
	_, err := tlstest.Handshake(addr, &tls.Config{ServerName: "localhost", RootCAs: pool, Time: w.clk.Now})
	return err
}

func holds(bundle []byte, fp string) bool {
	cas, err := pki.ParseCABundle(bundle)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(cas, func(c *x509.Certificate) bool { return authority.Fingerprint(c) == fp })
}

// markCompromised annotates the CA Secret as an operator does.
func (w *emergencyWorld) markCompromised(fp string) {
	w.t.Helper()
	for {
		s := w.secret()
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[authority.CompromisedCAAnnotation] = fp
		s.Annotations[authority.CompromisedReasonAnnotation] = "key leaked in a backup"
		s.Annotations[authority.CompromisedAtAnnotation] = w.clk.Now().UTC().Format(time.RFC3339)
		_, err := w.client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			require.NoError(w.t, err)
			return
		}
	}
}

// emergency marks the signing CA compromised and steps the clock a second
// at a time until it is gone from the published caBundle and the Secret,
// checking every step's handshakes; it returns how long that took on the
// fake clock.
func (w *emergencyWorld) emergency() time.Duration {
	w.t.Helper()
	bad := w.replicas[0].Leaf()
	require.NotNil(w.t, bad)
	var ca *x509.Certificate
	cas, err := pki.ParseCABundle(w.secret().Data["tls.crt"])
	require.NoError(w.t, err)
	ca = cas[0]
	fp := authority.Fingerprint(ca)
	require.True(w.t, holds(w.published(), fp), "the signing CA is published before the mark")
	for n, addr := range w.addrs {
		require.NoError(w.t, w.handshake(addr, pki.EncodeCertPEM(ca.Raw)), "replica %d serves a leaf of the CA about to be marked", n)
	}
	// A client following the published caBundle calls every replica
	// throughout, in real time: the emergency runs on events, between
	// clock steps.
	stop, done := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			w.followerHandshakes()
			calls.Add(1)
		}
	}()
	defer func() {
		close(stop)
		<-done
		w.t.Logf("%d rounds of handshakes with every replica by a client following the caBundle during the emergency; %d failed on the client's copy of the caBundle and verified against the one published when the replica answered (the emergency window)", calls.Load(), w.stale.Load())
	}()
	marked, markedReal := w.clk.Now(), time.Now()
	w.markCompromised(fp)
	w.settle()
	// The podcert signer's path: SignLeaf refuses the compromised CA as
	// soon as each replica has read the mark.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(w.t, err)
	for n, a := range w.replicas {
		w.await(fmt.Sprintf("replica %d's SignLeaf to refuse the compromised CA", n), func() bool {
			leaf, err := a.SignLeaf(authority.LeafRequest{PublicKey: key.Public(), Lifetime: time.Hour})
			if err == nil && authority.Fingerprint(leaf.CA) == fp {
				return false
			}
			return err == nil || errors.Is(err, authority.ErrNoSigningCA)
		})
	}
	w.followerHandshakes()
	for holds(w.published(), fp) || holds(w.secret().Data[dynamiccert.SecretCAKey], fp) {
		if w.clk.Since(marked) > 10*time.Minute {
			w.t.Fatalf("the compromised CA is still trusted %v (fake clock) after the mark: published caBundle holds it: %v, ca.crt holds it: %v, annotations %v",
				w.clk.Since(marked), holds(w.published(), fp), holds(w.secret().Data[dynamiccert.SecretCAKey], fp), w.secret().Annotations)
		}
		w.step(time.Second)
	}
	took := w.clk.Since(marked)
	w.t.Logf("compromised CA untrusted everywhere %v after the mark on the fake clock (%v real time)", took, time.Since(markedReal).Round(time.Millisecond))
	// Gone from every bundle: every replica serves a successor leaf, which
	// the published bundle verifies and a client trusting only the
	// compromised CA does not, from now on.
	for range 3 {
		for n, addr := range w.addrs {
			require.Error(w.t, w.handshake(addr, pki.EncodeCertPEM(ca.Raw)), "replica %d still serves a leaf of the compromised CA", n)
		}
		for n, a := range w.replicas {
			require.False(w.t, holds(a.CurrentCABundleContent(), fp), "replica %d's bundle", n)
			leaf, err := a.SignLeaf(authority.LeafRequest{PublicKey: key.Public(), Lifetime: time.Hour})
			require.NoError(w.t, err)
			require.NotEqual(w.t, fp, authority.Fingerprint(leaf.CA))
		}
		w.step(time.Second)
	}
	w.await("the Secret to record the emergency handled", func() bool {
		return w.secret().Annotations[authority.CompromisedHandledAnnotation] == fp
	})
	return took
}

// TestEmergencyRotationUntrustsCompromisedCA: with three replicas and a
// caBundle publisher running their Run loops, the operator marks the
// signing CA compromised. SignLeaf refuses it at once; a successor is
// published, signs without waiting for the minimum propagation delay
// (about 35 min here) and every replica re-issues its leaf; the compromised
// CA leaves the published caBundle and ca.crt as soon as every live replica
// serves a successor leaf, and a client that trusts only it fails from
// then on. A client following the published caBundle never fails. The same
// world then marks the successor compromised too: a second emergency.
func TestEmergencyRotationUntrustsCompromisedCA(t *testing.T) {
	t.Parallel() // see guard
	var times []time.Duration
	for run := range 3 {
		t.Run(fmt.Sprint("run=", run), func(t *testing.T) {
			w := newEmergencyWorld(t)
			times = append(times, w.emergency())
			// A second emergency: the successor that replaced the
			// compromised CA is marked too.
			times = append(times, w.emergency())
			require.Zero(t, w.failed.Load(), "failed handshakes of a client following the caBundle")
		})
	}
	slices.Sort(times)
	if len(times) > 0 {
		t.Logf("mark to compromised CA untrusted everywhere (fake clock), %d emergencies: p50 %v, max %v (all %v)", len(times), times[len(times)/2], times[len(times)-1], times)
	}
}

// enforceResourceVersions makes the fake API server keep resourceVersions
// and refuse an update carrying a stale one, as a real one does.
func enforceResourceVersions(client *fake.Clientset) {
	var rv atomic.Int64
	for _, r := range []struct {
		resource string
		gvr      schema.GroupVersionResource
		gr       schema.GroupResource
	}{
		{"secrets", corev1.SchemeGroupVersion.WithResource("secrets"), corev1.Resource("secrets")},
		{"leases", coordinationv1.SchemeGroupVersion.WithResource("leases"), coordinationv1.Resource("leases")},
	} {
		client.PrependReactor("create", r.resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
			action.(clienttesting.CreateAction).GetObject().(metav1.Object).SetResourceVersion(fmt.Sprint(rv.Add(1)))
			return false, nil, nil
		})
		client.PrependReactor("update", r.resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
			obj := action.(clienttesting.UpdateAction).GetObject().(metav1.Object)
			stored, err := client.Tracker().Get(r.gvr, obj.GetNamespace(), obj.GetName())
			if err != nil {
				return false, nil, nil
			}
			if cur := stored.(metav1.Object).GetResourceVersion(); obj.GetResourceVersion() != cur {
				return true, nil, apierrors.NewConflict(r.gr, obj.GetName(), fmt.Errorf("resourceVersion %q is not %q", obj.GetResourceVersion(), cur))
			}
			obj.SetResourceVersion(fmt.Sprint(rv.Add(1)))
			return false, nil, nil
		})
	}
}

// TestEmergencyWhileBlindIsCountedUnsafe: RBAC forbids listing the replicas'
// Leases, so no replica can see the others' announcements. An emergency
// does not wait for that view (the compromised CA must stop signing): the
// successor signs on each replica's own observers, and that promotion is
// an unsafe rotation, counted by the replica that made it and recorded in
// the Secret for every replica. Found by the simulator (a blind replica
// promoting an emergency's successor unseen, S1); this is its Run-loop test.
func TestEmergencyWhileBlindIsCountedUnsafe(t *testing.T) {
	w := newEmergencyWorldWith(t, func(c *fake.Clientset) {
		c.PrependReactor("list", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", errors.New("RBAC: list denied"))
		})
	})
	cas, err := pki.ParseCABundle(w.secret().Data["tls.crt"])
	require.NoError(t, err)
	fp := authority.Fingerprint(cas[0])
	w.markCompromised(fp)
	marked := w.clk.Now()
	for {
		signing, err := pki.ParseCABundle(w.secret().Data["tls.crt"])
		require.NoError(t, err)
		if authority.Fingerprint(signing[0]) != fp {
			break
		}
		require.Less(t, w.clk.Since(marked), 10*time.Minute, "the successor never signed")
		w.step(time.Second)
	}
	for range 5 {
		w.step(time.Second)
	}
	counted := 0
	for _, a := range w.replicas {
		s := a.Status()
		counted += s.UnsafeRotations
		assert.Equal(t, 1, s.RecordedUnsafeRotations, "%s: the unsafe rotation recorded in the Secret", a.Name())
		assert.Contains(t, s.LastUnsafeRotation, "unconfirmed by the other replicas", "%s", a.Name())
	}
	assert.Equal(t, 1, counted, "the promoting replica counts it, once")
}

// TestCompromisedCAPastedBackIsRotatedAgain: after an emergency has
// removed a compromised CA and recorded it handled, the CA comes back into
// tls.crt with its key (an operator restores an old backup by hand). It
// must not sign or stay trusted again: the emergency runs again, a new
// successor signs, the CA leaves every bundle, and every replica serves a
// leaf. Before, the pasted CA was taken for a successor and promoted while
// no replica would sign with it (the simulator, wider set, seed 2070: no
// replica ready).
func TestCompromisedCAPastedBackIsRotatedAgain(t *testing.T) {
	w := newEmergencyWorld(t)
	before := w.secret().DeepCopy()
	cas, err := pki.ParseCABundle(before.Data["tls.crt"])
	require.NoError(t, err)
	fp := authority.Fingerprint(cas[0])
	w.emergency()

	w.editSecret(func(s *corev1.Secret) {
		s.Data["tls.crt"], s.Data["tls.key"] = before.Data["tls.crt"], before.Data["tls.key"]
	})
	w.untilGone(fp, "the compromised CA pasted back")
	require.Zero(t, w.failed.Load(), "failed handshakes of a client following the caBundle")
}

// untilGone steps the clock until the CA fp neither signs nor is trusted
// (tls.crt, ca.crt, the published caBundle, every replica's bundle) and
// every replica serves a leaf of the Secret's signing CA, failing after 15
// minutes (what names the state, for the message).
func (w *emergencyWorld) untilGone(fp, what string) {
	w.t.Helper()
	since := w.clk.Now()
	done := func() bool {
		s := w.secret()
		signing, err := pki.ParseCABundle(s.Data["tls.crt"])
		if err != nil || authority.Fingerprint(signing[0]) == fp || holds(s.Data[dynamiccert.SecretCAKey], fp) || holds(w.published(), fp) {
			return false
		}
		for _, a := range w.replicas {
			leaf := a.Leaf()
			if leaf == nil || holds(a.CurrentCABundleContent(), fp) || authority.Fingerprint(signing[0]) != authority.Fingerprint(leafCA(w.t, a)) {
				return false
			}
		}
		return true
	}
	for !done() {
		s := w.secret()
		require.Less(w.t, w.clk.Since(since), 15*time.Minute, "%s is still in use: tls.crt holds it %v, ca.crt holds it %v, published %v, annotations %v",
			what, holds(s.Data["tls.crt"], fp), holds(s.Data[dynamiccert.SecretCAKey], fp), holds(w.published(), fp), s.Annotations)
		w.step(time.Second)
	}
	require.Zero(w.t, w.failed.Load(), "failed handshakes of a client following the caBundle")
}

// leafCA returns the CA in a's bundle that signed its leaf.
func leafCA(t testing.TB, a *authority.Authority) *x509.Certificate {
	t.Helper()
	cas, err := pki.ParseCABundle(a.CurrentCABundleContent())
	require.NoError(t, err)
	leaf := a.Leaf()
	for _, c := range cas {
		if leaf.CheckSignatureFrom(c) == nil {
			return c
		}
	}
	t.Fatalf("%s: no CA of its bundle signed its leaf", a.Name())
	return nil
}
