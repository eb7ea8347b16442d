package authority

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	clienttesting "k8s.io/client-go/testing"
)

// simClientset is a process's client of the simulated API server. The
// calls the rotation makes at every check and renewal (get, create and
// update of the Secret and of Leases) go to serve as the fake's reactor
// would pass them, without the fake's bookkeeping around it: Fake.Invokes
// keeps a deep copy of every action for tests to inspect (none here does)
// and hands the reactor another, and builds a typed client at every call.
// Here the object written is copied once (the action's, which serve keeps),
// and the answers are the fake's: the object served, or an empty one with
// the error. Every other call (lists, deletes, events) goes through the
// fake and its reactor, unchanged.
type simClientset struct {
	*fake.Clientset
	core  *simCoreV1
	coord *simCoordinationV1
}

func newSimClientset(w *simWorld, p *simProc) *simClientset {
	cs := &fake.Clientset{}
	cs.AddReactor("*", "*", func(a clienttesting.Action) (bool, apiruntime.Object, error) { return w.serve(p, a) })
	core := &simCoreV1{CoreV1Interface: cs.CoreV1()}
	core.secrets = &simSecrets{SecretInterface: core.CoreV1Interface.Secrets(simNamespace), w: w, p: p}
	coord := &simCoordinationV1{CoordinationV1Interface: cs.CoordinationV1()}
	coord.leases = &simLeases{LeaseInterface: coord.CoordinationV1Interface.Leases(simNamespace), w: w, p: p}
	return &simClientset{Clientset: cs, core: core, coord: coord}
}

func (c *simClientset) CoreV1() corev1client.CoreV1Interface { return c.core }

func (c *simClientset) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return c.coord
}

type simCoreV1 struct {
	corev1client.CoreV1Interface
	secrets *simSecrets
}

func (c *simCoreV1) Secrets(namespace string) corev1client.SecretInterface {
	if namespace != simNamespace {
		return c.CoreV1Interface.Secrets(namespace)
	}
	return c.secrets
}

type simCoordinationV1 struct {
	coordinationv1client.CoordinationV1Interface
	leases *simLeases
}

func (c *simCoordinationV1) Leases(namespace string) coordinationv1client.LeaseInterface {
	if namespace != simNamespace {
		return c.CoordinationV1Interface.Leases(namespace)
	}
	return c.leases
}

var (
	simSecretsResource = corev1.SchemeGroupVersion.WithResource("secrets")
	simLeasesResource  = coordinationv1.SchemeGroupVersion.WithResource("leases")
)

type simSecrets struct {
	corev1client.SecretInterface
	w *simWorld
	p *simProc
}

func (c *simSecrets) Get(_ context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error) {
	return simSecretResult(c.w.serve(c.p, clienttesting.NewGetActionWithOptions(simSecretsResource, simNamespace, name, opts)))
}

func (c *simSecrets) Create(_ context.Context, s *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error) {
	return simSecretResult(c.w.serve(c.p, clienttesting.NewCreateActionWithOptions(simSecretsResource, simNamespace, s.DeepCopy(), opts)))
}

func (c *simSecrets) Update(_ context.Context, s *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	return simSecretResult(c.w.serve(c.p, clienttesting.NewUpdateActionWithOptions(simSecretsResource, simNamespace, s.DeepCopy(), opts)))
}

// simSecretResult is what the fake's typed client returns for serve's
// answer.
func simSecretResult(_ bool, obj apiruntime.Object, err error) (*corev1.Secret, error) {
	if obj == nil {
		return &corev1.Secret{}, err
	}
	return obj.(*corev1.Secret), err
}

type simLeases struct {
	coordinationv1client.LeaseInterface
	w *simWorld
	p *simProc
}

func (c *simLeases) Get(_ context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	return simLeaseResult(c.w.serve(c.p, clienttesting.NewGetActionWithOptions(simLeasesResource, simNamespace, name, opts)))
}

func (c *simLeases) Create(_ context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	return simLeaseResult(c.w.serve(c.p, clienttesting.NewCreateActionWithOptions(simLeasesResource, simNamespace, l.DeepCopy(), opts)))
}

func (c *simLeases) Update(_ context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	return simLeaseResult(c.w.serve(c.p, clienttesting.NewUpdateActionWithOptions(simLeasesResource, simNamespace, l.DeepCopy(), opts)))
}

func simLeaseResult(_ bool, obj apiruntime.Object, err error) (*coordinationv1.Lease, error) {
	if obj == nil {
		return &coordinationv1.Lease{}, err
	}
	return obj.(*coordinationv1.Lease), err
}
