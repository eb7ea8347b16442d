//go:build soak

package soak

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	admissionregistrationv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	admissionregistrationv1client "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	clienttesting "k8s.io/client-go/testing"

	"github.com/evercert/evercert/internal/apitest"
)

var secretsGVR = corev1.SchemeGroupVersion.WithResource("secrets")

// rvTracker adds what the fake clientset lacks and the replicas rely on:
// optimistic concurrency. Every stored object gets a fresh resourceVersion
// on each write, and a write (update, patch) that carries a resourceVersion
// other than the stored one fails with 409 Conflict, as the API server does.
// Without it, two replicas writing at once would silently lose one write.
type rvTracker struct {
	clienttesting.ObjectTracker
	mu sync.Mutex
	rv int64
}

func (t *rvTracker) nextLocked() string {
	t.rv++
	return strconv.FormatInt(t.rv, 10)
}

func (t *rvTracker) Create(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.CreateOptions) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	obj = obj.DeepCopyObject()
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	m.SetResourceVersion(t.nextLocked())
	return t.ObjectTracker.Create(gvr, obj, ns, opts...)
}

func (t *rvTracker) Update(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.UpdateOptions) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.writeLocked(gvr, obj, ns, func(o runtime.Object) error { return t.ObjectTracker.Update(gvr, o, ns, opts...) })
}

func (t *rvTracker) Patch(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.PatchOptions) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	// The patched object carries the stored resourceVersion, unless the
	// patch set it (a precondition).
	return t.writeLocked(gvr, obj, ns, func(o runtime.Object) error { return t.ObjectTracker.Patch(gvr, o, ns, opts...) })
}

func (t *rvTracker) Apply(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.PatchOptions) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	if err := t.ObjectTracker.Apply(gvr, obj, ns, opts...); err != nil {
		return err
	}
	stored, err := t.ObjectTracker.Get(gvr, ns, m.GetName())
	if err != nil {
		return err
	}
	sm, _ := meta.Accessor(stored)
	sm.SetResourceVersion(t.nextLocked())
	return t.ObjectTracker.Update(gvr, stored, ns)
}

func (t *rvTracker) writeLocked(gvr schema.GroupVersionResource, obj runtime.Object, ns string, write func(runtime.Object) error) error {
	obj = obj.DeepCopyObject()
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	if rv := m.GetResourceVersion(); rv != "" {
		cur, err := t.ObjectTracker.Get(gvr, ns, m.GetName())
		if err != nil {
			return err
		}
		cm, _ := meta.Accessor(cur)
		if cm.GetResourceVersion() != rv {
			return apierrors.NewConflict(gvr.GroupResource(), m.GetName(),
				errors.New("the object has been modified; please apply your changes to the latest version and try again"))
		}
	}
	m.SetResourceVersion(t.nextLocked())
	return write(obj)
}

// fakeAPI is the one fake API server of a scenario: a fake clientset with
// optimistic concurrency, every request counted, and faults injected with a
// reactor prepended to the chain.
type fakeAPI struct {
	cs      *fake.Clientset
	tracker *rvTracker

	calls  atomic.Int64 // every request evercert made (watches included)
	mu     sync.Mutex
	byVerb map[string]int64 // "verb resource"
	// recent holds the latest requests (at least apitest.RecentWindow),
	// so that a scenario that never settles says what kept moving.
	recent []clienttesting.Action
	// renewals counts the Lease updates that change neither labels nor
	// annotations (only renewTime moves): the cost at rest.
	renewals atomic.Int64

	fault     atomic.Pointer[apiFault]
	faultHits atomic.Int64
}

// apiFault makes matching requests fail.
type apiFault struct {
	name string
	// verbs limits the fault to these verbs; nil means every verb (a
	// PrependReactor never sees watches).
	verbs []string
	// resources limits the fault to these resources; nil means every one.
	resources []string
	// err is the error of a failing request.
	err func(clienttesting.Action) error
	// lostResponse performs the request, then fails it: the API server
	// committed the write but the client never heard back.
	lostResponse bool
}

func (f *apiFault) matches(a clienttesting.Action) bool {
	return (f.verbs == nil || slices.Contains(f.verbs, a.GetVerb())) &&
		(f.resources == nil || slices.Contains(f.resources, a.GetResource().Resource))
}

func newFakeAPI(objects ...runtime.Object) *fakeAPI {
	cs := fake.NewClientset(objects...)
	tr := &rvTracker{ObjectTracker: cs.Tracker()}
	api := &fakeAPI{cs: cs, tracker: tr, byVerb: map[string]int64{}}
	react := clienttesting.ObjectReaction(tr)
	cs.ReactionChain = nil
	cs.AddReactor("*", "*", react)
	cs.WatchReactionChain = nil
	cs.AddWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := tr.Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		return true, w, nil
	})
	cs.PrependWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		api.count(action)
		return false, nil, nil
	})
	cs.PrependReactor("*", "*", func(action clienttesting.Action) (bool, runtime.Object, error) {
		api.count(action)
		if api.isRenewal(action) {
			api.renewals.Add(1)
		}
		f := api.fault.Load()
		if f == nil || !f.matches(action) {
			return false, nil, nil
		}
		api.faultHits.Add(1)
		if f.lostResponse {
			if _, _, err := react(action); err != nil {
				return true, nil, err
			}
		}
		return true, nil, f.err(action)
	})
	return api
}

func (a *fakeAPI) count(action clienttesting.Action) {
	a.calls.Add(1)
	a.mu.Lock()
	a.byVerb[action.GetVerb()+" "+action.GetResource().Resource]++
	a.recent = append(a.recent, action)
	if len(a.recent) >= 2*apitest.RecentWindow {
		a.recent = slices.Clone(a.recent[len(a.recent)-apitest.RecentWindow:])
	}
	a.mu.Unlock()
}

// isRenewal reports whether action updates a Lease without changing its
// labels or annotations.
func (a *fakeAPI) isRenewal(action clienttesting.Action) bool {
	u, ok := action.(clienttesting.UpdateAction)
	if !ok || action.GetResource().Resource != "leases" {
		return false
	}
	l, ok := u.GetObject().(*coordinationv1.Lease)
	if !ok {
		return false
	}
	stored, err := a.tracker.Get(leasesGVR, l.Namespace, l.Name)
	if err != nil {
		return false
	}
	s := stored.(*coordinationv1.Lease)
	return maps.Equal(s.Annotations, l.Annotations) && maps.Equal(s.Labels, l.Labels)
}

// nonWatch returns the requests other than watches so far.
func (a *fakeAPI) nonWatch() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for k, v := range a.byVerb {
		if !strings.HasPrefix(k, "watch ") {
			n += v
		}
	}
	return n
}

// requests returns the count of one "verb resource".
func (a *fakeAPI) requests(key string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byVerb[key]
}

// verbs returns the request counts by "verb resource", sorted.
func (a *fakeAPI) verbs() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(a.byVerb)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, a.byVerb[k]))
	}
	return strings.Join(parts, " ")
}

// lastRequests describes the latest requests by verb, resource and name.
func (a *fakeAPI) lastRequests() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return apitest.Recent(a.recent, apitest.RecentWindow)
}

// get reads an object straight from the tracker: the harness's reads are
// not requests of evercert's and are never faulted.
func (a *fakeAPI) get(gvr schema.GroupVersionResource, ns, name string) (runtime.Object, error) {
	return a.tracker.Get(gvr, ns, name)
}

func (a *fakeAPI) secret(ns, name string) *corev1.Secret {
	obj, err := a.get(secretsGVR, ns, name)
	if err != nil {
		return nil
	}
	return obj.(*corev1.Secret)
}

// The faults of the API-fault scenarios.
func forbiddenFault() *apiFault {
	return &apiFault{name: "403", err: func(a clienttesting.Action) error {
		return apierrors.NewForbidden(a.GetResource().GroupResource(), "", errors.New("soak: RBAC revoked"))
	}}
}

func internalErrorFault() *apiFault {
	return &apiFault{name: "500", err: func(clienttesting.Action) error {
		return apierrors.NewInternalError(errors.New("soak: etcd leader lost"))
	}}
}

func tooManyRequestsFault(retryAfter time.Duration) *apiFault {
	return &apiFault{name: "429", err: func(clienttesting.Action) error {
		return apierrors.NewTooManyRequests("soak: the API server is overloaded", int(retryAfter/time.Second))
	}}
}

func timeoutFault() *apiFault {
	return &apiFault{name: "timeout", err: func(a clienttesting.Action) error {
		if a.GetVerb() == "get" || a.GetVerb() == "list" {
			return apierrors.NewTimeoutError("soak: request timed out", 0)
		}
		return fmt.Errorf("soak: %s %s: %w", a.GetVerb(), a.GetResource().Resource, context.DeadlineExceeded)
	}}
}

// lostResponseFault commits writes but fails them with a timeout; reads
// work.
func lostResponseFault() *apiFault {
	return &apiFault{name: "lost-response", verbs: []string{"create", "update", "patch"}, lostResponse: true,
		err: func(a clienttesting.Action) error {
			return fmt.Errorf("soak: %s %s: response lost: %w", a.GetVerb(), a.GetResource().Resource, context.DeadlineExceeded)
		}}
}

func conflictFault() *apiFault {
	return &apiFault{name: "conflict", verbs: []string{"create", "update", "patch"}, err: func(a clienttesting.Action) error {
		if a.GetVerb() == "create" {
			return apierrors.NewAlreadyExists(a.GetResource().GroupResource(), "soak")
		}
		return apierrors.NewConflict(a.GetResource().GroupResource(), "soak", errors.New("soak: someone else wrote first"))
	}}
}

// race lets some replicas lose their writes to the others: a loser's write
// waits for a winner's to be committed.
type race struct {
	mu sync.Mutex
	ch chan struct{}
}

func newRace() *race { return &race{ch: make(chan struct{})} }

func (r *race) wait(d time.Duration) {
	r.mu.Lock()
	ch := r.ch
	r.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(d):
	}
}

// won wakes the losers waiting now.
func (r *race) won() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.ch)
	r.ch = make(chan struct{})
}

// podClient is one replica's client: the scenario's one fake clientset,
// with the replica's requests counted by verb and resource (to bound each
// loop's retries on its own) and a hook on the CA Secret writes (to crash
// the replica right after one was committed).
type podClient struct {
	kubernetes.Interface
	// afterSecretWrite, when set, is called after a committed Secret write
	// with the content before and after; it returns an error to report
	// instead of the result (a crash: the response never arrives).
	afterSecretWrite func(before, after *corev1.Secret) error
	// loseRace, when set, makes the replica lose its Secret writes to
	// another replica: a write waits until another replica's write is
	// committed (at most two seconds), then fails with 409 Conflict, as a
	// write of the same version does.
	loseRace atomic.Pointer[race]
	// fault, when set, fails this replica's matching requests (Secrets,
	// Leases and webhook configurations).
	fault atomic.Pointer[apiFault]
	api   *fakeAPI

	mu     sync.Mutex
	counts map[string]int64 // "verb resource"
}

// request counts a request and returns the error it fails with, if this
// replica's fault or lost race says so.
func (c *podClient) request(verb string, gvr schema.GroupVersionResource, ns string) error {
	c.mu.Lock()
	if c.counts == nil {
		c.counts = map[string]int64{}
	}
	c.counts[verb+" "+gvr.Resource]++
	c.mu.Unlock()
	if f := c.fault.Load(); f != nil {
		action := clienttesting.ActionImpl{Verb: verb, Resource: gvr, Namespace: ns}
		if f.matches(action) {
			return f.err(action)
		}
	}
	if r := c.loseRace.Load(); r != nil && gvr == secretsGVR && (verb == "update" || verb == "create") {
		r.wait(2 * time.Second)
		if verb == "create" {
			return apierrors.NewAlreadyExists(gvr.GroupResource(), secretName)
		}
		return apierrors.NewConflict(gvr.GroupResource(), secretName, errors.New("soak: another replica wrote first"))
	}
	return nil
}

// snapshot returns the counts so far.
func (c *podClient) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

// IsWatchListSemanticsUnSupported tells client-go's reflector, as the fake
// clientset itself does, that watch-list streaming is not available.
func (c *podClient) IsWatchListSemanticsUnSupported() bool { return true }

func (c *podClient) CoreV1() corev1client.CoreV1Interface {
	return podCoreV1{CoreV1Interface: c.Interface.CoreV1(), c: c}
}

func (c *podClient) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return podCoordinationV1{CoordinationV1Interface: c.Interface.CoordinationV1(), c: c}
}

func (c *podClient) AdmissionregistrationV1() admissionregistrationv1client.AdmissionregistrationV1Interface {
	return podAdmissionV1{AdmissionregistrationV1Interface: c.Interface.AdmissionregistrationV1(), c: c}
}

type podCoreV1 struct {
	corev1client.CoreV1Interface
	c *podClient
}

func (p podCoreV1) Secrets(ns string) corev1client.SecretInterface {
	return podSecrets{SecretInterface: p.CoreV1Interface.Secrets(ns), c: p.c, ns: ns}
}

type podSecrets struct {
	corev1client.SecretInterface
	c  *podClient
	ns string
}

func (s podSecrets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error) {
	if err := s.c.request("get", secretsGVR, s.ns); err != nil {
		return nil, err
	}
	return s.SecretInterface.Get(ctx, name, opts)
}

func (s podSecrets) List(ctx context.Context, opts metav1.ListOptions) (*corev1.SecretList, error) {
	if err := s.c.request("list", secretsGVR, s.ns); err != nil {
		return nil, err
	}
	return s.SecretInterface.List(ctx, opts)
}

func (s podSecrets) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if err := s.c.request("watch", secretsGVR, s.ns); err != nil {
		return nil, err
	}
	return s.SecretInterface.Watch(ctx, opts)
}

func (s podSecrets) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*corev1.Secret, error) {
	if err := s.c.request("patch", secretsGVR, s.ns); err != nil {
		return nil, err
	}
	return s.SecretInterface.Patch(ctx, name, pt, data, opts, sub...)
}

func (s podSecrets) Update(ctx context.Context, secret *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	if err := s.c.request("update", secretsGVR, s.ns); err != nil {
		return nil, err
	}
	before := s.c.api.secret(s.ns, secret.Name)
	out, err := s.SecretInterface.Update(ctx, secret, opts)
	if err == nil && s.c.afterSecretWrite != nil {
		if herr := s.c.afterSecretWrite(before, out); herr != nil {
			return nil, herr
		}
	}
	return out, err
}

func (s podSecrets) Create(ctx context.Context, secret *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error) {
	if err := s.c.request("create", secretsGVR, s.ns); err != nil {
		return nil, err
	}
	out, err := s.SecretInterface.Create(ctx, secret, opts)
	if err == nil && s.c.afterSecretWrite != nil {
		if herr := s.c.afterSecretWrite(nil, out); herr != nil {
			return nil, herr
		}
	}
	return out, err
}

type podCoordinationV1 struct {
	coordinationv1client.CoordinationV1Interface
	c *podClient
}

func (p podCoordinationV1) Leases(ns string) coordinationv1client.LeaseInterface {
	return podLeases{LeaseInterface: p.CoordinationV1Interface.Leases(ns), c: p.c, ns: ns}
}

var leasesGVR = coordinationv1.SchemeGroupVersion.WithResource("leases")

type podLeases struct {
	coordinationv1client.LeaseInterface
	c  *podClient
	ns string
}

func (l podLeases) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if err := l.c.request("get", leasesGVR, l.ns); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Get(ctx, name, opts)
}

func (l podLeases) List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	if err := l.c.request("list", leasesGVR, l.ns); err != nil {
		return nil, err
	}
	return l.LeaseInterface.List(ctx, opts)
}

func (l podLeases) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if err := l.c.request("watch", leasesGVR, l.ns); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Watch(ctx, opts)
}

func (l podLeases) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if err := l.c.request("create", leasesGVR, l.ns); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Create(ctx, lease, opts)
}

func (l podLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if err := l.c.request("update", leasesGVR, l.ns); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Update(ctx, lease, opts)
}

func (l podLeases) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	if err := l.c.request("delete", leasesGVR, l.ns); err != nil {
		return err
	}
	return l.LeaseInterface.Delete(ctx, name, opts)
}

func (l podLeases) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*coordinationv1.Lease, error) {
	if err := l.c.request("patch", leasesGVR, l.ns); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Patch(ctx, name, pt, data, opts, sub...)
}

type podAdmissionV1 struct {
	admissionregistrationv1client.AdmissionregistrationV1Interface
	c *podClient
}

func (p podAdmissionV1) ValidatingWebhookConfigurations() admissionregistrationv1client.ValidatingWebhookConfigurationInterface {
	return podWebhooks{ValidatingWebhookConfigurationInterface: p.AdmissionregistrationV1Interface.ValidatingWebhookConfigurations(), c: p.c}
}

type podWebhooks struct {
	admissionregistrationv1client.ValidatingWebhookConfigurationInterface
	c *podClient
}

const webhooksResource = "validatingwebhookconfigurations"

var webhooksGVR = admissionregistrationv1.SchemeGroupVersion.WithResource(webhooksResource)

func (v podWebhooks) Get(ctx context.Context, name string, opts metav1.GetOptions) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	if err := v.c.request("get", webhooksGVR, ""); err != nil {
		return nil, err
	}
	return v.ValidatingWebhookConfigurationInterface.Get(ctx, name, opts)
}

func (v podWebhooks) List(ctx context.Context, opts metav1.ListOptions) (*admissionregistrationv1.ValidatingWebhookConfigurationList, error) {
	if err := v.c.request("list", webhooksGVR, ""); err != nil {
		return nil, err
	}
	return v.ValidatingWebhookConfigurationInterface.List(ctx, opts)
}

func (v podWebhooks) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if err := v.c.request("watch", webhooksGVR, ""); err != nil {
		return nil, err
	}
	return v.ValidatingWebhookConfigurationInterface.Watch(ctx, opts)
}

func (v podWebhooks) Update(ctx context.Context, obj *admissionregistrationv1.ValidatingWebhookConfiguration, opts metav1.UpdateOptions) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	if err := v.c.request("update", webhooksGVR, ""); err != nil {
		return nil, err
	}
	return v.ValidatingWebhookConfigurationInterface.Update(ctx, obj, opts)
}

func (v podWebhooks) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	if err := v.c.request("patch", webhooksGVR, ""); err != nil {
		return nil, err
	}
	return v.ValidatingWebhookConfigurationInterface.Patch(ctx, name, pt, data, opts, sub...)
}

func (v podWebhooks) Apply(ctx context.Context, obj *admissionregistrationv1ac.ValidatingWebhookConfigurationApplyConfiguration, opts metav1.ApplyOptions) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	if err := v.c.request("apply", webhooksGVR, ""); err != nil {
		return nil, err
	}
	return v.ValidatingWebhookConfigurationInterface.Apply(ctx, obj, opts)
}
