package podcert

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/evercert/evercert/authority"
)

// testNow is the fake clocks' start. Certificate times have second
// precision.
var testNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// guard bounds every wait for something asynchronous to happen; it is a
// generous ceiling, never a timing assertion.
const guard = 30 * time.Second

const (
	testSigner = "evercert.io/serving"
	testNS     = "apps"
	testNode   = "node-1"
)

var pcrResource = certificatesv1.SchemeGroupVersion.WithResource("podcertificaterequests")

// fakeAPI is the fake clientset with what the signer relies on from a real
// API server: resourceVersions on every PodCertificateRequest write, a
// conflict for a write based on an older one, and a status that is frozen
// once final (the API refuses the change as invalid). It counts the status
// writes that succeeded, per request.
type fakeAPI struct {
	*fake.Clientset
	mu       sync.Mutex
	rv       int
	written  map[string]int
	attempts atomic.Int64
	// before, when set, runs first on every status write and may answer it.
	before func(*certificatesv1.PodCertificateRequest) error
}

func newFakeAPI() *fakeAPI {
	f := &fakeAPI{Clientset: fake.NewClientset(), written: map[string]int{}}
	f.PrependReactor("create", "podcertificaterequests", func(a clienttesting.Action) (bool, runtime.Object, error) {
		obj := a.(clienttesting.CreateAction).GetObject().(*certificatesv1.PodCertificateRequest).DeepCopy()
		f.mu.Lock()
		defer f.mu.Unlock()
		f.rv++
		obj.ResourceVersion = strconv.Itoa(f.rv)
		obj.CreationTimestamp = metav1.NewTime(testNow)
		return true, obj, f.Tracker().Create(pcrResource, obj, obj.Namespace)
	})
	f.PrependReactor("update", "podcertificaterequests", func(a clienttesting.Action) (bool, runtime.Object, error) {
		ua := a.(clienttesting.UpdateAction)
		obj := ua.GetObject().(*certificatesv1.PodCertificateRequest).DeepCopy()
		if ua.GetSubresource() == "status" {
			f.attempts.Add(1)
			if f.before != nil {
				if err := f.before(obj); err != nil {
					return true, nil, err
				}
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		cur, err := f.Tracker().Get(pcrResource, obj.Namespace, obj.Name)
		if err != nil {
			return true, nil, err
		}
		stored := cur.(*certificatesv1.PodCertificateRequest)
		if stored.ResourceVersion != obj.ResourceVersion {
			return true, nil, apierrors.NewConflict(pcrResource.GroupResource(), obj.Name, fmt.Errorf("resourceVersion %s is not %s", obj.ResourceVersion, stored.ResourceVersion))
		}
		if final(stored) {
			return true, nil, apierrors.NewInvalid(certificatesv1.Kind("PodCertificateRequest"), obj.Name,
				field.ErrorList{field.Invalid(field.NewPath("status"), "", "immutable after PodCertificateRequest is issued, denied, or failed")})
		}
		f.rv++
		obj.ResourceVersion = strconv.Itoa(f.rv)
		if ua.GetSubresource() == "status" {
			f.written[obj.Name]++
		}
		return true, obj, f.Tracker().Update(pcrResource, obj, obj.Namespace)
	})
	return f
}

func (f *fakeAPI) writes(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.written[name]
}

// env is a running Authority (its Run loop, on a fake clock) and the
// objects of one workload: pods of service account "web" selected by
// Service "web", on node-1.
type env struct {
	t     *testing.T
	api   *fakeAPI
	clk   *clocktesting.FakeClock
	ca    *authority.Authority
	obs   *testObserver
	seq   atomic.Int64
	ctx   context.Context
	stopF context.CancelFunc
	wg    sync.WaitGroup
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, api: newFakeAPI(), clk: clocktesting.NewFakeClock(testNow), obs: &testObserver{}}
	e.obs.ok.Store(true)
	e.ctx, e.stopF = context.WithCancel(context.Background())
	t.Cleanup(e.stop)
	e.ca = e.authority("replica-a")
	for _, svc := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "web"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "web-headless"}, Spec: corev1.ServiceSpec{ClusterIP: "None", Selector: map[string]string{"app": "web", "tier": "front"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "db"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "db"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "manual"}},
	} {
		_, err := e.api.CoreV1().Services(testNS).Create(context.Background(), svc, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	return e
}

func (e *env) stop() {
	e.stopF()
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(guard):
		e.t.Error("Run loops did not return after their context ended")
	}
}

// authority starts one Authority replica on the shared CA Secret.
func (e *env) authority(id string) *authority.Authority {
	e.t.Helper()
	a, err := authority.New(authority.Config{
		Name: "podcert-test-" + id, Namespace: "evercert", SecretName: "signer-ca", Client: e.api, ReplicaID: id,
		Hosts: []string{"signer.evercert.svc"}, Lifetime: 6 * time.Hour, CALifetime: 48 * time.Hour, CARenewBefore: 16 * time.Hour,
		PropagationDelay: time.Hour, Observers: []authority.Observer{e.obs}, Clock: e.clk, DisableReplicaAnnouncements: true,
	})
	require.NoError(e.t, err)
	e.wg.Go(func() { a.Run(e.ctx, 1) })
	require.Eventually(e.t, func() bool { return a.Leaf() != nil }, guard, time.Millisecond, "the Authority read its CA")
	return a
}

// signer starts a Signer with policy on ca.
func (e *env) signer(ca LeafSigner, policy Policy, mutate ...func(*SignerConfig)) *Signer {
	e.t.Helper()
	cfg := SignerConfig{SignerName: testSigner, CA: ca, Client: e.api, Policy: policy, Clock: e.clk}
	for _, m := range mutate {
		m(&cfg)
	}
	watches := e.watches()
	s, err := NewSigner(cfg)
	require.NoError(e.t, err)
	e.wg.Go(func() { s.Run(e.ctx, 2) })
	require.Eventually(e.t, s.HasSynced, guard, time.Millisecond)
	// The fake API cannot resume a watch from the list's resourceVersion:
	// a request created before the watch is open would be lost, which a
	// real API server never does.
	require.Eventually(e.t, func() bool { return e.watches() > watches }, guard, time.Millisecond, "the signer's watch is open")
	return s
}

// watches counts the watches opened on PodCertificateRequests.
func (e *env) watches() int {
	n := 0
	for _, a := range e.api.Actions() {
		if a.GetVerb() == "watch" && a.GetResource() == pcrResource {
			n++
		}
	}
	return n
}

// pod creates a pod of service account sa with labels on node-1.
func (e *env) pod(name, sa string, labels map[string]string) *corev1.Pod {
	e.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, UID: types.UID("uid-" + name), Labels: labels},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, NodeName: testNode},
	}
	p, err := e.api.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{})
	require.NoError(e.t, err)
	return p
}

// newKey makes a key of one of the API's key types.
func newKey(t *testing.T, keyType string) crypto.Signer {
	t.Helper()
	var key crypto.Signer
	var err error
	switch keyType {
	case KeyTypeECDSAP256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case KeyTypeECDSAP384:
		key, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case KeyTypeRSA3072:
		key, err = rsa.GenerateKey(rand.Reader, 3072)
	case KeyTypeED25519:
		_, key, err = ed25519.GenerateKey(rand.Reader)
	default:
		t.Fatalf("no key type %q in this test", keyType)
	}
	require.NoError(t, err)
	return key
}

// request creates a PodCertificateRequest for pod as the kubelet does: an
// empty CSR signed by a fresh key. It returns the request and the key.
func (e *env) request(pod *corev1.Pod, keyType string, mutate ...func(*certificatesv1.PodCertificateRequest)) (*certificatesv1.PodCertificateRequest, crypto.Signer) {
	e.t.Helper()
	key := newKey(e.t, keyType)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	require.NoError(e.t, err)
	pcr := &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: fmt.Sprintf("req-%d", e.seq.Add(1))},
		Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName: testSigner, PodName: pod.Name, PodUID: pod.UID,
			ServiceAccountName: pod.Spec.ServiceAccountName, ServiceAccountUID: "uid-sa-" + types.UID(pod.Spec.ServiceAccountName),
			NodeName: types.NodeName(pod.Spec.NodeName), NodeUID: "uid-node", MaxExpirationSeconds: ptr.To[int32](86400),
			StubPKCS10Request: csr,
		},
	}
	for _, m := range mutate {
		m(pcr)
	}
	pcr, err = e.api.CertificatesV1().PodCertificateRequests(pod.Namespace).Create(context.Background(), pcr, metav1.CreateOptions{})
	require.NoError(e.t, err)
	return pcr, key
}

// final waits for the request's final status.
func (e *env) final(pcr *certificatesv1.PodCertificateRequest) *certificatesv1.PodCertificateRequest {
	e.t.Helper()
	var got *certificatesv1.PodCertificateRequest
	require.Eventually(e.t, func() bool {
		cur, err := e.api.CertificatesV1().PodCertificateRequests(pcr.Namespace).Get(context.Background(), pcr.Name, metav1.GetOptions{})
		require.NoError(e.t, err)
		got = cur
		return final(cur)
	}, guard, time.Millisecond, "request %s decided", pcr.Name)
	return got
}

// credentialBundle is what the kubelet writes to credentialBundlePath: the
// PKCS#8 private key, then the chain.
func credentialBundle(t *testing.T, key crypto.Signer, chain string) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return append(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), chain...)
}

// testObserver is an Observer of the Authority the test confirms by hand;
// it notifies, as real observers do.
type testObserver struct {
	mu sync.Mutex
	ls []dynamiccertificates.Listener
	ok atomic.Bool
}

func (o *testObserver) Name() string                    { return "test-observer" }
func (o *testObserver) Observed(*x509.Certificate) bool { return o.ok.Load() }
func (o *testObserver) AddListener(l dynamiccertificates.Listener) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ls = append(o.ls, l)
}
func (o *testObserver) set(ok bool) {
	o.ok.Store(ok)
	o.mu.Lock()
	ls := o.ls
	o.mu.Unlock()
	for _, l := range ls {
		l.Enqueue()
	}
}

// recorder collects Events.
func recorder() *events.FakeRecorder { return events.NewFakeRecorder(100) }

var _ dynamiccertificates.Notifier = &testObserver{}

func metav1GetOptions() metav1.GetOptions { return metav1.GetOptions{} }
