//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"

	signerapp "github.com/evercert/evercert/example/signer/app"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/podcert"
)

const (
	signerUser     = "evercert-signer"
	signerCASecret = "signer-ca"
	// The workload of example/signer/policy.yaml and pod.yaml.
	webhookAppNS  = "evercert-example-webhook"
	webhookAppSA  = "evercert-example-webhook"
	webhookSvc    = "evercert-example-webhook"
	e2eNode       = "e2e-node"
	signerName    = signerapp.DefaultSignerName
	policyExample = "../../example/signer/policy.yaml"
)

// decodeYAML decodes every object of a multi-document YAML file.
func decodeYAML(t *testing.T, path string) []runtime.Object {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var objs []runtime.Object
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		require.NoError(t, err)
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		require.NoError(t, err, path)
		objs = append(objs, obj)
	}
}

// startSignerReplica runs the example signer in-process on a free port of
// 127.0.0.1 with the CA in ns/signerCASecret, the example policy and the
// flags args. It is stopped when the test ends.
func startSignerReplica(t *testing.T, kubeconfig string, args ...string) *signerapp.Signer {
	t.Helper()
	opts := signerapp.NewOptions()
	fs := pflag.NewFlagSet("signer", pflag.ContinueOnError)
	opts.AddFlags(fs)
	require.NoError(t, fs.Parse(append([]string{
		"--bind-address=127.0.0.1", "--secure-port=0",
		"--kubeconfig=" + kubeconfig, "--ca-secret=" + ns + "/" + signerCASecret,
		"--policy=" + policyExample, "--self-signed-hosts=evercert-signer." + ns + ".svc",
	}, args...)))
	opts.ShutdownTimeout = 2 * time.Second
	s, err := signerapp.New(opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "signer replica")
		case <-time.After(15 * time.Second):
			t.Error("signer replica did not stop within 15s")
		}
	})
	return s
}

// examplePod returns example/signer/pod.yaml named name, on e2eNode, with
// mutate applied.
func examplePod(t *testing.T, name string, mutate func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	objs := decodeYAML(t, "../../example/signer/pod.yaml")
	require.Len(t, objs, 1)
	pod := objs[0].(*corev1.Pod)
	pod.Name = name
	pod.Spec.NodeName = e2eNode
	if mutate != nil {
		mutate(pod)
	}
	return pod
}

// podCertificate returns the pod's podCertificate projection.
func podCertificate(t *testing.T, pod *corev1.Pod) *corev1.PodCertificateProjection {
	t.Helper()
	for _, v := range pod.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.PodCertificate != nil {
				return s.PodCertificate
			}
		}
	}
	t.Fatalf("pod %s has no podCertificate volume", pod.Name)
	return nil
}

// kubelet plays the kubelet of e2eNode: it creates PodCertificateRequests
// as system:node:e2e-node (under the Node authorizer and NodeRestriction),
// follows them with an informer filtered by spec.nodeName, as the kubelet
// does, and writes the credential bundle as the kubelet does.
type kubelet struct {
	t      *testing.T
	client kubernetes.Interface
	admin  kubernetes.Interface
	node   *corev1.Node
	dir    string

	mu      sync.Mutex
	waiters map[string]chan *certificatesv1.PodCertificateRequest
	decided map[string]*certificatesv1.PodCertificateRequest
}

func startKubelet(t *testing.T, cluster *testcluster.Cluster, admin kubernetes.Interface) *kubelet {
	t.Helper()
	ctx := context.Background()
	client := kubernetes.NewForConfigOrDie(cluster.UserConfig("system:node:"+e2eNode, "system:nodes"))
	// A kubelet registers its own Node.
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e2eNode}}, metav1.CreateOptions{})
	require.NoError(t, err)
	k := &kubelet{t: t, client: client, admin: admin, node: node, dir: t.TempDir(),
		waiters: map[string]chan *certificatesv1.PodCertificateRequest{}, decided: map[string]*certificatesv1.PodCertificateRequest{}}
	selector := fields.OneTermEqualSelector("spec.nodeName", e2eNode).String()
	requests := client.CertificatesV1().PodCertificateRequests(metav1.NamespaceAll)
	informer := cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return requests.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return requests.Watch(ctx, o)
		},
	}, &certificatesv1.PodCertificateRequest{}, 0, cache.Indexers{})
	_, err = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    k.observe,
		UpdateFunc: func(_, obj any) { k.observe(obj) },
	})
	require.NoError(t, err)
	ictx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); informer.RunWithContext(ictx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, informer.HasSynced, 30*time.Second, 10*time.Millisecond, "the kubelet's request informer synced")
	return k
}

func (k *kubelet) observe(obj any) {
	pcr, ok := obj.(*certificatesv1.PodCertificateRequest)
	if !ok || len(pcr.Status.Conditions) == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, seen := k.decided[pcr.Name]; seen {
		return
	}
	k.decided[pcr.Name] = pcr
	if ch := k.waiters[pcr.Name]; ch != nil {
		ch <- pcr
	}
}

// request creates a PodCertificateRequest for pod's podCertificate volume
// as the kubelet does (a fresh key of the volume's key type, an empty CSR
// signed by it) and waits for the signer's decision. It returns the key,
// the decided request, and the time from create to seeing the decision.
// create creates pcr as the node. NodeRestriction reads the pod named in
// the request from the kube-apiserver's informer cache, which can lag the
// pod's creation by a moment (CI saw "pod \"webhook-0\" not found" 0.1 s
// after the create); a real kubelet only asks for pods it already runs.
// So a refusal naming a missing pod is retried with backoff (50 ms
// doubling to 2 s, jittered) for at most 30 s, and any other answer is
// returned.
func (k *kubelet) create(ctx context.Context, pcr *certificatesv1.PodCertificateRequest) (*certificatesv1.PodCertificateRequest, error) {
	retry := backoff.New(50*time.Millisecond, 2*time.Second)
	for deadline := time.Now().Add(30 * time.Second); ; {
		created, err := k.client.CertificatesV1().PodCertificateRequests(pcr.Namespace).Create(ctx, pcr, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "named in the PodCertificateRequest: pod") || !strings.Contains(err.Error(), "not found") || time.Now().After(deadline) {
			return created, err
		}
		time.Sleep(retry.Next(err))
	}
}

func (k *kubelet) request(pod *corev1.Pod) (crypto.Signer, *certificatesv1.PodCertificateRequest, time.Duration) {
	k.t.Helper()
	ctx := context.Background()
	src := podCertificate(k.t, pod)
	key := newPodKey(k.t, src.KeyType)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	require.NoError(k.t, err)
	sa, err := k.admin.CoreV1().ServiceAccounts(pod.Namespace).Get(ctx, pod.Spec.ServiceAccountName, metav1.GetOptions{})
	require.NoError(k.t, err)
	pcr := &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pod.Namespace, GenerateName: "req-",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}},
		},
		Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName: src.SignerName, PodName: pod.Name, PodUID: pod.UID,
			ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID,
			NodeName: types.NodeName(e2eNode), NodeUID: k.node.UID,
			MaxExpirationSeconds: src.MaxExpirationSeconds, StubPKCS10Request: csr,
			UnverifiedUserAnnotations: src.UserAnnotations,
		},
	}
	ch := make(chan *certificatesv1.PodCertificateRequest, 1)
	start := time.Now()
	created, err := k.create(ctx, pcr)
	require.NoError(k.t, err, "creating a request as the node")
	k.mu.Lock()
	if d := k.decided[created.Name]; d != nil {
		ch <- d
	} else {
		k.waiters[created.Name] = ch
	}
	k.mu.Unlock()
	select {
	case got := <-ch:
		return key, got, time.Since(start)
	case <-time.After(time.Minute):
		k.t.Fatalf("request %s/%s for pod %s not decided within a minute", created.Namespace, created.Name, pod.Name)
		return nil, nil, 0
	}
}

// writeBundle writes the credential bundle of an issued request the way
// the kubelet writes credentialBundlePath: the PKCS#8 private key, then the
// chain as plain CERTIFICATE blocks (anything between or around the blocks,
// and block headers, dropped), swapped in atomically through the projected
// volume's ..data symlink. It returns the file's path.
func (k *kubelet) writeBundle(pod *corev1.Pod, key crypto.Signer, pcr *certificatesv1.PodCertificateRequest) string {
	k.t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(k.t, err)
	var b bytes.Buffer
	require.NoError(k.t, pem.Encode(&b, &pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	for rest := []byte(pcr.Status.CertificateChain); ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		require.NoError(k.t, pem.Encode(&b, &pem.Block{Type: block.Type, Bytes: block.Bytes}))
	}
	dir, name := filepath.Join(k.dir, pod.Name), podCertificate(k.t, pod).CredentialBundlePath
	tlstest.KubeletWriteFile(k.t, dir, name, b.Bytes())
	return filepath.Join(dir, name)
}

func newPodKey(t *testing.T, keyType string) crypto.Signer {
	t.Helper()
	switch keyType {
	case podcert.KeyTypeECDSAP256:
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		return k
	case podcert.KeyTypeED25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		return k
	}
	t.Fatalf("no key type %q in this test", keyType)
	return nil
}

// caHistory follows the signer's CA Secret and remembers, for every CA that
// became the signing CA (tls.crt), the resourceVersion at which it did.
// resourceVersions come from the one etcd, so they order the Secret's
// writes and the requests' status writes against each other.
type caHistory struct {
	mu      sync.Mutex
	signing map[string]int64 // CA serial -> resourceVersion of the Secret that first had it as tls.crt
	next    map[string]bool  // CA serials seen as next.crt
}

func followCA(t *testing.T, admin kubernetes.Interface) *caHistory {
	t.Helper()
	h := &caHistory{signing: map[string]int64{}, next: map[string]bool{}}
	w, err := admin.CoreV1().Secrets(ns).Watch(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=" + signerCASecret})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*corev1.Secret)
			if !ok {
				continue
			}
			rv, _ := strconv.ParseInt(s.ResourceVersion, 10, 64)
			h.mu.Lock()
			if c := parseCert(s.Data["tls.crt"]); c != nil {
				if _, seen := h.signing[c.SerialNumber.Text(16)]; !seen {
					h.signing[c.SerialNumber.Text(16)] = rv
				}
			}
			if c := parseCert(s.Data["next.crt"]); c != nil {
				h.next[c.SerialNumber.Text(16)] = true
			}
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return h
}

func parseCert(data []byte) *x509.Certificate {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	return c
}

// signedFrom returns the CA of bundle that signed leaf.
func signedFrom(t *testing.T, leaf *x509.Certificate, bundle []byte) *x509.Certificate {
	t.Helper()
	for rest := bundle; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		ca, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		if leaf.CheckSignatureFrom(ca) == nil {
			return ca
		}
	}
	t.Fatalf("no CA of the bundle signed leaf %s", leaf.SerialNumber.Text(16))
	return nil
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// TestE2EPodCertificateSigner runs two replicas of the example signer
// (example/signer: its flags, policy.yaml and rbac.yaml) against a real
// kube-apiserver with the Node authorizer and NodeRestriction, while the
// test acts as the kubelet of one node for pods made from
// example/signer/pod.yaml. The signers' CA rotates every ~20 s on the real
// clock during the run.
//
//   - Webhook pods, selected by their Service, keep asking for certificates
//     as the kubelet does at every refresh: each request is Issued for the
//     Service's names, the credential bundle written as the kubelet writes
//     it serves a real TLS handshake that verifies against the signer's CA
//     bundle, and every leaf comes from a CA that the CA Secret showed as
//     the signing CA before the request was issued (resourceVersions), so
//     never from a successor that was only published.
//   - Requests outside the policy are Denied with their reason, with a
//     Warning Event; NodeRestriction keeps the node from asking for another
//     pod's UID, and a forged request (by an admin) is denied by the signer.
//   - With two replicas side by side, every request's status is written once
//     (issued and denied counts equal the decided requests; a replica that
//     lost a race counts a conflict).
//
// It logs the request-to-issued time (p50/p99) as the kubelet sees it.
func TestE2EPodCertificateSigner(t *testing.T) {
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: signerUser}),
		// The harness already authorizes with RBAC; this adds the Node
		// authorizer, which lets nodes create PodCertificateRequests.
		testcluster.WithAPIServerFlags("--authorization-mode=Node", "--enable-admission-plugins=NodeRestriction"))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	ctx := context.Background()
	setupNamespace(t, admin)
	for _, name := range []string{webhookAppNS, "payments"} {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, sa := range []struct{ ns, name string }{{webhookAppNS, webhookAppSA}, {webhookAppNS, "intruder"}, {"payments", "api"}} {
		_, err := admin.CoreV1().ServiceAccounts(sa.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa.name}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	_, err := admin.CoreV1().Services(webhookAppNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: webhookSvc},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "evercert-example-webhook"},
			Ports: []corev1.ServicePort{{Port: 443}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	applySignerRBAC(t, admin, signerUser, signerCASecret)
	kubeconfig := writeKubeconfig(t, cluster.UserConfig(signerUser))
	history := followCA(t, admin)

	durationLabels := map[string]string{"signer": signerName, "result": certmetrics.PodCertificateIssued}
	durationCountBefore, durationSumBefore := certmetricstest.Histogram(t, "evercert_podcertificate_request_duration_seconds", durationLabels)
	issuedBefore := certmetricstest.PodCertificateRequests(t, signerName, certmetrics.PodCertificateIssued)
	deniedBefore := certmetricstest.PodCertificateRequests(t, signerName, certmetrics.PodCertificateDenied)
	conflictsBefore := certmetricstest.PodCertificateRequests(t, signerName, certmetrics.PodCertificateConflict)

	// A new CA every ~20 s: its successor is published 20 s after it was
	// made, and signs 3 s later once both replicas announce it. Leaves
	// live 24 h capped at the CA's expiry (~2 h), above the API's 1 h.
	rotate := []string{"--self-signed-validity=1h", "--ca-validity=2h", "--ca-renew-before=1h59m40s", "--ca-propagation-delay=3s"}
	replicas := []*signerapp.Signer{startSignerReplica(t, kubeconfig, rotate...), startSignerReplica(t, kubeconfig, rotate...)}
	for i, r := range replicas {
		select {
		case <-r.Ready():
		case <-time.After(time.Minute):
			t.Fatalf("signer replica %d not ready within a minute", i)
		}
	}
	k := startKubelet(t, cluster, admin)

	createPod := func(pod *corev1.Pod) *corev1.Pod {
		t.Helper()
		if pod.Namespace == "" {
			pod.Namespace = webhookAppNS
		}
		p, err := admin.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		require.NoError(t, err)
		return p
	}
	serviceNames := []string{webhookSvc + "." + webhookAppNS + ".svc", webhookSvc + "." + webhookAppNS + ".svc.cluster.local"}

	// --- Outside the policy: denied, with reasons.
	intruder := createPod(examplePod(t, "intruder", func(p *corev1.Pod) { p.Spec.ServiceAccountName = "intruder" }))
	edPod := createPod(examplePod(t, "webhook-ed25519", func(p *corev1.Pod) { podCertificate(t, p).KeyType = podcert.KeyTypeED25519 }))
	greedy := createPod(examplePod(t, "webhook-greedy", func(p *corev1.Pod) {
		podCertificate(t, p).UserAnnotations = map[string]string{podcert.DNSNamesAnnotation: serviceNames[0] + ",evil.example.com"}
	}))
	payments := createPod(examplePod(t, "payments-api", func(p *corev1.Pod) {
		p.Namespace, p.Spec.ServiceAccountName, p.Labels = "payments", "api", map[string]string{"app": "api"}
	}))
	decidedAs := map[string]string{}
	for pod, reason := range map[*corev1.Pod]string{
		intruder: podcert.ReasonNotAllowed,
		edPod:    certificatesv1.PodCertificateRequestConditionUnsupportedKeyType,
		greedy:   podcert.ReasonDNSNameNotAllowed,
	} {
		_, pcr, _ := k.request(pod)
		c := pcr.Status.Conditions
		require.Len(t, c, 1)
		assert.Equal(t, certificatesv1.PodCertificateRequestConditionTypeDenied, c[0].Type, "%s: %s", pod.Name, c[0].Message)
		assert.Equal(t, reason, c[0].Reason, "%s: %s", pod.Name, c[0].Message)
		assert.Empty(t, pcr.Status.CertificateChain)
		decidedAs[pcr.Name] = c[0].Type
		t.Logf("pod %s: %s %s: %s", pod.Name, c[0].Type, c[0].Reason, c[0].Message)
	}
	// The static rule of the example policy.
	key, pcr, _ := k.request(payments)
	require.Equal(t, certificatesv1.PodCertificateRequestConditionTypeIssued, pcr.Status.Conditions[0].Type, pcr.Status.Conditions[0].Message)
	leaf := parseCert([]byte(pcr.Status.CertificateChain))
	assert.Equal(t, []string{"payments.example.com"}, leaf.DNSNames)
	assert.True(t, leaf.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()))
	decidedAs[pcr.Name] = certificatesv1.PodCertificateRequestConditionTypeIssued

	// NodeRestriction: the node cannot ask for a pod UID that is not the
	// pod's; an admin can, and the signer denies it.
	web := createPod(examplePod(t, "webhook-0", nil))
	forged := &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: webhookAppNS, GenerateName: "forged-"},
		Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName: signerName, PodName: web.Name, PodUID: "00000000-0000-0000-0000-000000000001",
			ServiceAccountName: webhookAppSA, ServiceAccountUID: "00000000-0000-0000-0000-000000000002",
			NodeName: e2eNode, NodeUID: k.node.UID,
		},
	}
	fkey := newPodKey(t, podcert.KeyTypeECDSAP256)
	forged.Spec.StubPKCS10Request, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, fkey)
	require.NoError(t, err)
	_, err = k.create(ctx, forged)
	require.Error(t, err, "NodeRestriction refuses another pod UID")
	require.Contains(t, err.Error(), "differs from running pod", "NodeRestriction refuses another pod UID (%s)", apierrors.ReasonForError(err))
	created, err := admin.CertificatesV1().PodCertificateRequests(webhookAppNS).Create(ctx, forged, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		cur, err := admin.CertificatesV1().PodCertificateRequests(webhookAppNS).Get(ctx, created.Name, metav1.GetOptions{})
		require.NoError(t, err)
		if len(cur.Status.Conditions) == 0 {
			return false
		}
		assert.Equal(t, podcert.ReasonPodMismatch, cur.Status.Conditions[0].Reason, cur.Status.Conditions[0].Message)
		decidedAs[cur.Name] = cur.Status.Conditions[0].Type
		return true
	}, time.Minute, 10*time.Millisecond, "the forged request is decided")

	// --- The webhook pods refresh their certificates through CA rotations.
	pods := []*corev1.Pod{web}
	for i := 1; i < 3; i++ {
		pods = append(pods, createPod(examplePod(t, fmt.Sprintf("webhook-%d", i), nil)))
	}
	type issuance struct {
		pcr     *certificatesv1.PodCertificateRequest
		leaf    *x509.Certificate
		ca      *x509.Certificate
		latency time.Duration
	}
	var (
		mu      sync.Mutex
		issued  []issuance
		issuers = map[string]bool{}
	)
	const minRequests, minIssuers = 60, 3
	enough := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(issued) >= minRequests && len(issuers) >= minIssuers
	}
	deadline := time.Now().Add(4 * time.Minute)
	var wg sync.WaitGroup
	for _, pod := range pods {
		wg.Go(func() {
			for !enough() && !t.Failed() && time.Now().Before(deadline) {
				key, pcr, took := k.request(pod)
				c := pcr.Status.Conditions[0]
				if !assert.Equal(t, certificatesv1.PodCertificateRequestConditionTypeIssued, c.Type, "%s: %s %s", pcr.Name, c.Reason, c.Message) {
					return
				}
				path := k.writeBundle(pod, key, pcr)
				bundle, err := os.ReadFile(path)
				require.NoError(t, err)
				// One file holds the key and the chain, as a pod reads it.
				pair, err := tls.X509KeyPair(bundle, bundle)
				require.NoError(t, err, "the credential bundle is a key and its chain")
				leaf, err := x509.ParseCertificate(pair.Certificate[0])
				require.NoError(t, err)
				assert.Equal(t, serviceNames, leaf.DNSNames)
				assert.True(t, leaf.NotBefore.Equal(pcr.Status.NotBefore.Time), "status.notBefore is the leaf's")
				assert.True(t, leaf.NotAfter.Equal(pcr.Status.NotAfter.Time), "status.notAfter is the leaf's")
				life := leaf.NotAfter.Sub(leaf.NotBefore)
				assert.True(t, life >= time.Hour && life <= 24*time.Hour, "lifetime %v", life)
				refresh := pcr.Status.BeginRefreshAt.Time
				assert.False(t, refresh.Before(leaf.NotBefore.Add(10*time.Minute)) || refresh.After(leaf.NotAfter.Add(-10*time.Minute)), "beginRefreshAt %v", refresh)

				caBundle := replicas[0].CABundle()
				ca := signedFrom(t, leaf, caBundle)
				assert.False(t, leaf.NotAfter.After(ca.NotAfter), "the leaf outlives its CA")
				addr := tlstest.Server(t, &tls.Config{Certificates: []tls.Certificate{pair}})
				for _, name := range serviceNames {
					_, err := tlstest.Handshake(addr, &tls.Config{ServerName: name, RootCAs: tlstest.Pool(t, caBundle)})
					require.NoError(t, err, "a client trusting the signer's bundle verifies %s", name)
				}
				mu.Lock()
				issued = append(issued, issuance{pcr: pcr, leaf: leaf, ca: ca, latency: took})
				issuers[ca.SerialNumber.Text(16)] = true
				mu.Unlock()
				// Pacing between a pod's requests, not an assertion: the
				// run lasts until the CA rotated, whatever the rate.
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
	require.GreaterOrEqual(t, len(issued), minRequests, "requests issued before the deadline")
	require.GreaterOrEqual(t, len(issuers), minIssuers, "CAs that signed during the run: the CA rotated")

	// Every leaf came from a CA that was the signing CA before the request
	// was issued: never from a successor that was only published.
	history.mu.Lock()
	for _, is := range issued {
		promoted, ok := history.signing[is.ca.SerialNumber.Text(16)]
		rv, _ := strconv.ParseInt(is.pcr.ResourceVersion, 10, 64)
		assert.True(t, ok && promoted < rv, "request %s (resourceVersion %d) signed by CA %s, which was the signing CA from resourceVersion %d (seen: %v)",
			is.pcr.Name, rv, is.ca.SerialNumber.Text(16), promoted, ok)
		decidedAs[is.pcr.Name] = certificatesv1.PodCertificateRequestConditionTypeIssued
	}
	signingCAs, published := len(history.signing), len(history.next)
	history.mu.Unlock()

	// One status write per request, whichever replica won.
	var nIssued, nDenied float64
	for _, typ := range decidedAs {
		switch typ {
		case certificatesv1.PodCertificateRequestConditionTypeIssued:
			nIssued++
		case certificatesv1.PodCertificateRequestConditionTypeDenied:
			nDenied++
		}
	}
	require.Eventually(t, func() bool {
		return certmetricstest.PodCertificateRequests(t, signerName, certmetrics.PodCertificateIssued)-issuedBefore == nIssued &&
			certmetricstest.PodCertificateRequests(t, signerName, certmetrics.PodCertificateDenied)-deniedBefore == nDenied
	}, 30*time.Second, 10*time.Millisecond, "issued and denied counted once per request: %v issued, %v denied", nIssued, nDenied)
	all, err := admin.CertificatesV1().PodCertificateRequests(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, p := range all.Items {
		require.Len(t, p.Status.Conditions, 1, "request %s", p.Name)
		assert.Equal(t, decidedAs[p.Name], p.Status.Conditions[0].Type, "request %s", p.Name)
	}

	// Denials are Events too.
	evs, err := admin.EventsV1().Events(webhookAppNS).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	var reasons []string
	for _, ev := range evs.Items {
		if ev.Regarding.Kind == "PodCertificateRequest" && ev.Type == corev1.EventTypeWarning {
			reasons = append(reasons, ev.Reason)
		}
	}
	assert.Subset(t, reasons, []string{podcert.ReasonNotAllowed, podcert.ReasonDNSNameNotAllowed, podcert.ReasonPodMismatch,
		certificatesv1.PodCertificateRequestConditionUnsupportedKeyType})

	latencies := make([]time.Duration, 0, len(issued))
	for _, is := range issued {
		latencies = append(latencies, is.latency)
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	conflicts := certmetricstest.PodCertificateRequests(t, signerName, certmetrics.PodCertificateConflict) - conflictsBefore
	t.Logf("%d requests issued by 2 replicas through %d signing CAs (%d published as successors; %d CAs signed leaves); %v denied; %v write conflicts between the replicas",
		len(issued), signingCAs, published, len(issuers), nDenied, conflicts)
	t.Logf("request-to-issued as the kubelet sees it (create to informer event), n=%d: p50 %v, p99 %v, max %v",
		len(latencies), percentile(latencies, 0.50).Round(100*time.Microsecond), percentile(latencies, 0.99).Round(100*time.Microsecond),
		latencies[len(latencies)-1].Round(100*time.Microsecond))
	count, sum := certmetricstest.Histogram(t, "evercert_podcertificate_request_duration_seconds", durationLabels)
	t.Logf("signer side (evercert_podcertificate_request_duration_seconds, informer event to status written): mean %v over %d issuances",
		(time.Duration((sum - durationSumBefore) / float64(count-durationCountBefore) * float64(time.Second))).Round(100*time.Microsecond), count-durationCountBefore)
}
