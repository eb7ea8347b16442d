//go:build e2e

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
	"github.com/evercert/evercert/sni"
)

// The CLI against a real kube-apiserver and etcd (internal/testcluster),
// run as the built binary in a child process, as operators run it. make
// test-cli runs these and fails unless each printed --- PASS.

const cliNS = "evercert-cli"

// cliCluster starts a cluster with the test namespace and returns an admin
// client and a kubeconfig file whose context's namespace is cliNS.
func cliCluster(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	cluster := testcluster.Start(t)
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	_, err := admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cliNS}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return admin, writeKubeconfig(t, cluster.Config())
}

func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cli"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, TLSServerName: cfg.ServerName}
	kc.AuthInfos["cli"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["cli"] = &clientcmdapi.Context{Cluster: "cli", AuthInfo: "cli", Namespace: cliNS}
	kc.CurrentContext = "cli"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// runners runs controllers until the test ends.
type runners struct {
	ctx context.Context
	wg  sync.WaitGroup
}

func newRunners(t *testing.T) *runners {
	ctx, cancel := context.WithCancel(context.Background())
	r := &runners{ctx: ctx}
	t.Cleanup(func() { cancel(); r.wg.Wait() })
	return r
}

func (r *runners) run(c interface{ Run(context.Context, int) }) { r.wg.Go(func() { c.Run(r.ctx, 1) }) }

// startReplica starts one Authority replica of secret, announcing itself
// in its Lease.
func startReplica(t *testing.T, r *runners, client kubernetes.Interface, secret, id string) *authority.Authority {
	t.Helper()
	a, err := authority.New(authority.Config{
		Namespace: cliNS, SecretName: secret, Client: client, Hosts: []string{"webhook.test"}, ReplicaID: id,
	})
	require.NoError(t, err)
	require.NoError(t, a.RunOnce(r.ctx))
	r.run(a)
	return a
}

// inertValidatingWebhook matches no request (a made-up group) and has no
// caBundle yet.
func inertValidatingWebhook(name string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	none := admissionregistrationv1.SideEffectClassNone
	ignore := admissionregistrationv1.Ignore
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "inert.evercert.test",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: cliNS, Name: "inert"}},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{"inert.evercert.test"}, APIVersions: []string{"v1"}, Resources: []string{"inert"}}}},
			SideEffects:             &none,
			FailurePolicy:           &ignore,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

// publish creates the ValidatingWebhookConfiguration name and runs a
// cabundle publisher of source into it until the test ends; it returns
// once the bundle is there.
func publish(t *testing.T, r *runners, admin kubernetes.Interface, cfg *rest.Config, source *authority.Authority, name string) {
	t.Helper()
	vwcs := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	_, err := vwcs.Create(r.ctx, inertValidatingWebhook(name), metav1.CreateOptions{})
	require.NoError(t, err)
	p, err := cabundle.NewPublisher(cabundle.PublisherConfig{
		Name: name, Source: source, KubeConfig: cfg,
		Targets: []cabundle.Target{{Kind: cabundle.ValidatingWebhookConfiguration, Name: name}},
	})
	require.NoError(t, err)
	r.run(p)
	require.Eventually(t, func() bool {
		o, err := vwcs.Get(r.ctx, name, metav1.GetOptions{})
		return err == nil && len(o.Webhooks[0].ClientConfig.CABundle) > 0
	}, time.Minute, 50*time.Millisecond, "the publisher wrote the caBundle of %s", name)
}

// waitLeases waits until the Leases of secret announce the leaves the
// given replicas serve.
func waitLeases(t *testing.T, admin kubernetes.Interface, secret string, replicas ...*authority.Authority) {
	t.Helper()
	waitAnnounced(t, admin, secret, func() []string {
		serials := make([]string, len(replicas))
		for i, a := range replicas {
			serials[i] = a.Leaf().SerialNumber.Text(16)
		}
		return serials
	})
}

// waitAnnounced waits until the Leases of secret announce every leaf
// whose serial (hexadecimal, as LeafSerialAnnotation holds it) serials
// returns, read again at each try: the leaves replicas serve, in this
// process or another.
func waitAnnounced(t *testing.T, admin kubernetes.Interface, secret string, serials func() []string) {
	t.Helper()
	sel := authority.LeaseSelector(secret)
	require.Eventually(t, func() bool {
		list, err := admin.CoordinationV1().Leases(cliNS).List(context.Background(), metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return false
		}
		announced := map[string]bool{}
		for _, l := range list.Items {
			announced[l.Annotations[authority.LeafSerialAnnotation]] = true
		}
		for _, serial := range serials() {
			if !announced[serial] {
				return false
			}
		}
		return true
	}, time.Minute, 50*time.Millisecond, "every replica's Lease announces its leaf")
}

func secretCA(t *testing.T, admin kubernetes.Interface, name string) *corev1.Secret {
	t.Helper()
	s, err := admin.CoreV1().Secrets(cliNS).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return s
}

// TestCLIStatus: two Authority replicas and a published
// ValidatingWebhookConfiguration. status reports the signing CA, both
// replicas live serving leaves of it, and the webhook verifying both
// (exit 0), in text and JSON; a webhook whose caBundle is empty fails
// (exit 3), and so does a missing one. Then a successor is published in
// the Secret: status names it and both replicas as pending observers (the
// minimum propagation delay keeps them from trusting it).
func TestCLIStatus(t *testing.T) {
	admin, kubeconfig := cliCluster(t)
	r := newRunners(t)
	const secret = "status-ca"
	a := startReplica(t, r, admin, secret, "replica-a")
	b := startReplica(t, r, admin, secret, "replica-b")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	publish(t, r, admin, cfg, a, "status-webhook")
	_, err = admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(r.ctx, inertValidatingWebhook("unpublished"), metav1.CreateOptions{})
	require.NoError(t, err)
	waitLeases(t, admin, secret, a, b)
	signing := a.Status().Signing.Fingerprint

	env := []string{"KUBECONFIG=" + kubeconfig}
	code, out := cli(t, env, "status", secret, "--webhook", "validating/status-webhook", "-o", "json")
	require.Equal(t, exitOK, code, "status of a healthy Authority")
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep), "status -o json")
	require.NotNil(t, rep.Signing)
	assert.Equal(t, signing, rep.Signing.Fingerprint, "the signing CA")
	assert.Nil(t, rep.Successor)
	assert.True(t, rep.Healthy)
	require.Len(t, rep.Replicas, 2)
	for i, want := range []*authority.Authority{a, b} {
		got := rep.Replicas[i]
		assert.Equal(t, want.ReplicaID(), got.ID)
		assert.True(t, got.Live, "%s is live", got.ID)
		assert.Equal(t, want.Leaf().SerialNumber.Text(16), got.LeafSerial, "%s's served leaf", got.ID)
		assert.Equal(t, signing, got.LeafCA, "%s's leaf is signed by the signing CA", got.ID)
		assert.Contains(t, got.TrustedCAs, signing)
	}
	require.Len(t, rep.Targets, 1)
	assert.True(t, rep.Targets[0].Verifies, "the published webhook verifies both replicas")
	assert.Len(t, rep.Targets[0].Replicas, 2)

	// Text, from the context's namespace (no -n) and --kubeconfig.
	code, out = cli(t, nil, "status", secret, "--kubeconfig", kubeconfig, "--webhook", "validating/status-webhook")
	require.Equal(t, exitOK, code)
	for _, want := range []string{"Signing CA:", signing, "replica-a", "replica-b", "judged on this machine's clock",
		"validating/status-webhook", "verifies every live replica's leaf", "Healthy."} {
		assert.Contains(t, out, want)
	}

	code, out = cli(t, env, "status", secret, "--webhook", "validating/unpublished", "--webhook", "validating/missing")
	assert.Equal(t, exitFailed, code, "a webhook without the CA, and a missing one")
	assert.Contains(t, out, "DOES NOT verify every live replica's leaf")
	assert.Contains(t, out, "the CA bundle is empty")
	assert.Contains(t, out, "validating/missing: not found")

	code, out = cli(t, env, "status", "no-such-secret")
	assert.Equal(t, exitError, code, "a missing Secret is an API error")
	assert.Contains(t, out, "reading the CA Secret "+cliNS+"/no-such-secret")

	// A successor published in the Secret, as the Authority publishes
	// one: in next.crt/next.key and ca.crt, with its publication time.
	next, err := pki.NewCA(pki.Request{CommonName: "successor", Now: time.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	published := time.Now().UTC().Truncate(time.Second)
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := secretCA(t, admin, secret)
		s.Data[authority.NextCertKey], s.Data[authority.NextKeyKey] = next.CertPEM, next.KeyPEM
		s.Data[dynamiccert.SecretCAKey] = append(append([]byte{}, s.Data[dynamiccert.SecretCAKey]...), next.CertPEM...)
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[authority.NextSinceAnnotation] = published.Format(time.RFC3339)
		_, err := admin.CoreV1().Secrets(cliNS).Update(r.ctx, s, metav1.UpdateOptions{})
		return err
	}))
	code, out = cli(t, env, "status", secret, "-o", "json")
	require.Equal(t, exitOK, code)
	rep = statusReport{}
	require.NoError(t, json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep))
	require.NotNil(t, rep.Successor, "the successor")
	assert.Equal(t, authority.Fingerprint(next.Cert), rep.Successor.Fingerprint)
	require.NotNil(t, rep.Successor.PublishedAt)
	assert.True(t, published.Equal(*rep.Successor.PublishedAt), "published at %v, want %v", rep.Successor.PublishedAt, published)
	assert.ElementsMatch(t, []string{"replica-a", "replica-b"}, rep.Successor.PendingObservers,
		"both live replicas are still inside the minimum propagation delay")
	assert.Len(t, rep.Bundle, 2)
}

// TestCLIStatusLongSecretName: two replicas of the Authority of a Secret
// whose name is 69 characters long (valid for a Secret, too long for a
// label value) on a real kube-apiserver: both write their Lease, each
// sees the other, and status lists both as live. Before, the name was
// copied into the Lease label: every Lease write was Invalid, the list
// failed, and the replicas stopped waiting for each other without a word.
func TestCLIStatusLongSecretName(t *testing.T) {
	admin, kubeconfig := cliCluster(t)
	r := newRunners(t)
	secret := "long-" + strings.Repeat("x", 64)
	a := startReplica(t, r, admin, secret, "replica-a")
	b := startReplica(t, r, admin, secret, "replica-b")
	waitLeases(t, admin, secret, a, b)
	for _, x := range []*authority.Authority{a, b} {
		require.Eventually(t, func() bool { return len(x.ServedChains()) == 2 }, time.Minute, 50*time.Millisecond,
			"%s sees both replicas: %v", x.ReplicaID(), x.ServedChains())
	}
	code, out := cli(t, []string{"KUBECONFIG=" + kubeconfig}, "status", secret, "-o", "json")
	require.Equal(t, exitOK, code, out)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep), "status -o json")
	require.Len(t, rep.Replicas, 2, "status finds both Leases by the same label")
	var ids []string
	for _, got := range rep.Replicas {
		ids = append(ids, got.ID)
		assert.True(t, got.Live, "%s is live", got.ID)
	}
	assert.ElementsMatch(t, []string{a.ReplicaID(), b.ReplicaID()}, ids)
}

// TestCLIRotate: rotate sets evercert.io/rotate-requested (RFC 3339) on
// the Secret; --wait without an Authority acting times out with exit 1
// and says what it waited for; --wait returns once the annotation
// rotate-handled is set to the request (set here by the test, standing in
// for the Authority). rotate --compromised marks the signing CA by
// default, with the reason and time; without --reason it is a usage error
// (exit 2) and so is a fingerprint the Secret does not hold; neither
// changes the Secret.
func TestCLIRotate(t *testing.T) {
	admin, kubeconfig := cliCluster(t)
	const secret = "rotate-ca"
	ca, err := pki.NewCA(pki.Request{CommonName: "rotate-ca", Now: time.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	old, err := pki.NewCA(pki.Request{CommonName: "rotate-old", Now: time.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	_, err = admin.CoreV1().Secrets(cliNS).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret},
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM,
			dynamiccert.SecretCAKey: append(append([]byte{}, old.CertPEM...), ca.CertPEM...)},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	env := []string{"KUBECONFIG=" + kubeconfig}

	before := time.Now().Truncate(time.Second)
	code, out := cli(t, env, "rotate", secret, "-n", cliNS)
	require.Equal(t, exitOK, code, "rotate")
	requested := secretCA(t, admin, secret).Annotations[authority.RotateRequestedAnnotation]
	at, err := time.Parse(time.RFC3339, requested)
	require.NoError(t, err, "%s is RFC 3339", authority.RotateRequestedAnnotation)
	assert.False(t, at.Before(before), "requested at %v, the command ran after %v", at, before)
	assert.Contains(t, out, authority.RotateRequestedAnnotation+"="+requested)

	// No Authority runs here: --wait gives up at --timeout, exit 1.
	code, out = cli(t, env, "rotate", secret, "--wait", "--timeout", "3s")
	assert.Equal(t, exitError, code, "rotate --wait with nothing acting on it")
	assert.Contains(t, out, "timed out after 3s waiting for the Authority to act: "+authority.RotateHandledAnnotation)
	assert.NotEmpty(t, secretCA(t, admin, secret).Annotations[authority.RotateRequestedAnnotation], "the request stays set")

	// Something acting on the request (standing in for the Authority)
	// ends the wait.
	stop := make(chan struct{})
	handled := make(chan struct{})
	go func() {
		defer close(handled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				s, err := admin.CoreV1().Secrets(cliNS).Get(context.Background(), secret, metav1.GetOptions{})
				if err != nil {
					return err
				}
				want := s.Annotations[authority.RotateRequestedAnnotation]
				if s.Annotations[authority.RotateHandledAnnotation] == want {
					return nil
				}
				s.Annotations[authority.RotateHandledAnnotation] = want
				_, err = admin.CoreV1().Secrets(cliNS).Update(context.Background(), s, metav1.UpdateOptions{})
				return err
			})
		}
	}()
	code, out = cli(t, env, "rotate", secret, "--wait", "-o", "json")
	close(stop)
	<-handled
	require.Equal(t, exitOK, code, "rotate --wait with the request acted on")
	var rep rotateReport
	// --wait's progress lines (stderr) may come before the JSON (stdout).
	require.NoError(t, json.Unmarshal([]byte(out[strings.Index(out, "{"):strings.LastIndex(out, "}")+1]), &rep))
	assert.True(t, rep.Handled)
	assert.Equal(t, secretCA(t, admin, secret).Annotations[authority.RotateRequestedAnnotation], rep.Annotations[authority.RotateRequestedAnnotation])

	// --compromised: usage errors change nothing.
	rv := secretCA(t, admin, secret).ResourceVersion
	code, out = cli(t, env, "rotate", secret, "--compromised")
	assert.Equal(t, exitUsage, code, "--compromised without --reason")
	assert.Contains(t, out, "--compromised requires a non-empty --reason")
	code, out = cli(t, env, "rotate", secret, "--compromised", "--reason", "leaked", "--ca", "00112233445566778899aabbccddeeff")
	assert.Equal(t, exitUsage, code, "--ca not in the Secret")
	assert.Contains(t, out, "holds no CA with that fingerprint")
	assert.Contains(t, out, authority.Fingerprint(ca.Cert), "the message lists the CAs the Secret holds")
	assert.Equal(t, rv, secretCA(t, admin, secret).ResourceVersion, "refused requests do not write the Secret")

	code, _ = cli(t, env, "rotate", secret, "--compromised", "--reason", "key found in a public bucket")
	require.Equal(t, exitOK, code, "rotate --compromised")
	ann := secretCA(t, admin, secret).Annotations
	assert.Equal(t, authority.Fingerprint(ca.Cert), ann[authority.CompromisedCAAnnotation], "the signing CA by default")
	assert.Equal(t, "key found in a public bucket", ann[authority.CompromisedReasonAnnotation])
	_, err = time.Parse(time.RFC3339, ann[authority.CompromisedAtAnnotation])
	assert.NoError(t, err, "%s is RFC 3339", authority.CompromisedAtAnnotation)

	// Another CA marked while the first is not handled yet is refused;
	// the same one again (an operator repeating it) is not.
	code, out = cli(t, env, "rotate", secret, "--compromised", "--reason", "also", "--ca", authority.Fingerprint(old.Cert))
	assert.Equal(t, exitUsage, code, "a second compromised CA while the first is pending")
	assert.Contains(t, out, "already marks CA "+authority.Fingerprint(ca.Cert)+" compromised")
	code, out = cli(t, env, "rotate", secret, "--compromised", "--reason", "again", "--wait", "--timeout", "2s")
	assert.Equal(t, exitError, code, "--compromised --wait with nothing acting on it")
	assert.Contains(t, out, authority.CompromisedHandledAnnotation)
}

// TestCLICheck: a real TLS server on 127.0.0.1 serving an Authority's leaf
// (through the sni controller, as a webhook does). check verifies it
// against the published webhook's caBundle and against ca.crt in a file,
// naming the CA and the replica that answered (exit 0), and against a
// ClusterTrustBundle holding ca.crt; against a CA that
// did not sign it, it fails with exit 3; an address with nothing listening
// is exit 1.
func TestCLICheck(t *testing.T) {
	admin, kubeconfig := cliCluster(t)
	r := newRunners(t)
	const secret = "check-ca"
	a := startReplica(t, r, admin, secret, "replica-check")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	publish(t, r, admin, cfg, a, "check-webhook")
	waitLeases(t, admin, secret, a)
	ctrl, err := sni.NewDynamicServingCertificateController(sni.ControllerConfig{Serving: a})
	require.NoError(t, err)
	r.run(ctrl)
	require.Eventually(t, ctrl.HasSynced, 30*time.Second, 10*time.Millisecond)
	addr := tlstest.Server(t, ctrl.TLSConfig())
	signing := parseCertPEM(secretCA(t, admin, secret).Data[corev1.TLSCertKey])
	require.NotNil(t, signing, "the signing CA in tls.crt")
	env := []string{"KUBECONFIG=" + kubeconfig}

	code, out := cli(t, env, "check", addr, "--webhook", "validating/check-webhook", "--server-name", "webhook.test", "--authority", secret)
	require.Equal(t, exitOK, code, "check against the published caBundle")
	assert.Contains(t, out, "Verified against validating/check-webhook by CA "+signing.Subject.String()+" (fingerprint "+authority.Fingerprint(signing)+")")
	assert.Contains(t, out, "Answered by replica replica-check of "+secret)

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, secretCA(t, admin, secret).Data[dynamiccert.SecretCAKey], 0o600))
	code, out = cli(t, env, "check", addr, "--ca-file", caFile, "--authority", secret, "-o", "json")
	require.Equal(t, exitOK, code, "check against ca.crt in a file")
	var rep checkReport
	require.NoError(t, json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep))
	assert.True(t, rep.Verified)
	require.NotNil(t, rep.CA)
	assert.Equal(t, authority.Fingerprint(signing), rep.CA.Fingerprint)
	assert.Equal(t, "replica-check", rep.Replica)
	assert.Equal(t, a.Leaf().SerialNumber.Text(16), rep.Leaf.Serial)

	// A ClusterTrustBundle holding ca.crt.
	_, err = admin.CertificatesV1().ClusterTrustBundles().Create(r.ctx, &certificatesv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "check-ctb"},
		Spec:       certificatesv1.ClusterTrustBundleSpec{TrustBundle: string(secretCA(t, admin, secret).Data[dynamiccert.SecretCAKey])},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	code, out = cli(t, env, "check", addr, "--cluster-trust-bundle", "check-ctb", "--server-name", "webhook.test")
	require.Equal(t, exitOK, code, "check against a ClusterTrustBundle")
	assert.Contains(t, out, "Verified against clustertrustbundle/check-ctb by CA "+signing.Subject.String())

	// A bundle that does not verify: another CA.
	other, err := pki.NewCA(pki.Request{CommonName: "other", Now: time.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	otherFile := filepath.Join(t.TempDir(), "other.crt")
	require.NoError(t, os.WriteFile(otherFile, other.CertPEM, 0o600))
	code, out = cli(t, env, "check", addr, "--ca-file", otherFile)
	assert.Equal(t, exitFailed, code, "check against a CA that did not sign the leaf")
	assert.Contains(t, out, "NOT verified against file "+otherFile)
	assert.Contains(t, out, "certificate signed by unknown authority")

	// The right CA but the wrong name.
	code, out = cli(t, env, "check", addr, "--ca-file", caFile, "--server-name", "other.test")
	assert.Equal(t, exitFailed, code, "check for a name the leaf does not hold")
	assert.Contains(t, out, "other.test")

	// Nothing listening: a network error, exit 1.
	code, out = cli(t, env, "check", "127.0.0.1:1", "--ca-file", caFile)
	assert.Equal(t, exitError, code, "check of a closed port")
	assert.Contains(t, out, "TLS handshake with 127.0.0.1:1")
}

// TestCLIRotateActedOnByAuthorities: two Authority replicas run against
// the cluster. rotate --wait returns once an Authority published a
// successor and recorded it; rotate --compromised --wait returns once the
// compromised CA left ca.crt, and status then finds a healthy Authority
// whose published webhook verifies both replicas' new leaves, with the
// compromised CA nowhere in the Secret's bundle.
func TestCLIRotateActedOnByAuthorities(t *testing.T) {
	admin, kubeconfig := cliCluster(t)
	r := newRunners(t)
	const secret = "acted-ca"
	a := startReplica(t, r, admin, secret, "replica-a")
	b := startReplica(t, r, admin, secret, "replica-b")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	publish(t, r, admin, cfg, a, "acted-webhook")
	waitLeases(t, admin, secret, a, b)
	env := []string{"KUBECONFIG=" + kubeconfig}

	code, out := cli(t, env, "rotate", secret, "--wait", "--timeout", "1m", "-o", "json")
	require.Equal(t, exitOK, code, "rotate --wait with two Authorities running: %s", out)
	var rep rotateReport
	// --wait's progress lines (stderr) may come before the JSON (stdout).
	require.NoError(t, json.Unmarshal([]byte(out[strings.Index(out, "{"):strings.LastIndex(out, "}")+1]), &rep))
	assert.True(t, rep.Handled, "rotate-handled recorded")
	s := secretCA(t, admin, secret)
	assert.Equal(t, s.Annotations[authority.RotateRequestedAnnotation], s.Annotations[authority.RotateHandledAnnotation])
	require.Eventually(t, func() bool { return a.Status().Successor != nil && b.Status().Successor != nil },
		time.Minute, 50*time.Millisecond, "both replicas hold the successor the request published")

	compromised := a.Status().Signing.Fingerprint
	code, out = cli(t, env, "rotate", secret, "--compromised", "--reason", "key in a leaked backup", "--wait", "--timeout", "2m")
	require.Equal(t, exitOK, code, "rotate --compromised --wait with two Authorities running: %s", out)
	s = secretCA(t, admin, secret)
	assert.Equal(t, compromised, s.Annotations[authority.CompromisedHandledAnnotation])
	bundle, err := pki.ParseCABundle(s.Data[dynamiccert.SecretCAKey])
	require.NoError(t, err)
	for _, c := range bundle {
		assert.NotEqual(t, compromised, authority.Fingerprint(c), "the compromised CA is gone from %s", dynamiccert.SecretCAKey)
	}
	for _, x := range []*authority.Authority{a, b} {
		assert.NotEqual(t, compromised, x.Status().Signing.Fingerprint, "%s no longer signs with the compromised CA", x.ReplicaID())
	}

	// status agrees: once both replicas announce leaves from the new CA and
	// the publisher wrote the new bundle, it is healthy again.
	deadline := time.Now().Add(time.Minute)
	for {
		code, out = cli(t, env, "status", secret, "--webhook", "validating/acted-webhook")
		if code == exitOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	require.Equal(t, exitOK, code, "status after the emergency rotation: %s", out)
}

// TestCLIStatusRejectsForgedLeases: two Authority replicas and a published
// webhook, and two Leases with the Authority's label written by someone
// who may write Leases but holds no leaf of the Authority: one carries
// replica-b's ID and its leaf, copied, with a signature made by another
// key; one a made-up ID and replica-a's leaf, unsigned. status shows both
// as rejected with the reason, in JSON and text, counts neither as a
// replica (the webhook's check, the successor's pending observers), is
// unhealthy because of them (exit 3), and reports replica-b as the genuine
// replica it is.
func TestCLIStatusRejectsForgedLeases(t *testing.T) {
	admin, kubeconfig := cliCluster(t)
	r := newRunners(t)
	const secret = "forged-ca"
	a := startReplica(t, r, admin, secret, "replica-a")
	b := startReplica(t, r, admin, secret, "replica-b")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	publish(t, r, admin, cfg, a, "forged-webhook")
	waitLeases(t, admin, secret, a, b)
	signing := a.Status().Signing.Fingerprint

	leases := admin.CoordinationV1().Leases(cliNS)
	list, err := leases.List(r.ctx, metav1.ListOptions{LabelSelector: authority.LeaseSelector(secret)})
	require.NoError(t, err)
	genuine := map[string]*coordinationv1.Lease{}
	for i := range list.Items {
		genuine[*list.Items[i].Spec.HolderIdentity] = &list.Items[i]
	}
	require.Contains(t, genuine, "replica-a")
	require.Contains(t, genuine, "replica-b")
	attacker, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	digest := sha256.Sum256([]byte("whatever the attacker signs"))
	foreignSig, err := ecdsa.SignASN1(rand.Reader, attacker, digest[:])
	require.NoError(t, err)
	forge := func(name, holder string, from *coordinationv1.Lease, sig []byte) {
		t.Helper()
		ann := map[string]string{}
		for _, k := range []string{authority.LeafAnnotation, authority.LeafSerialAnnotation, authority.BundleHashAnnotation} {
			ann[k] = from.Annotations[k]
		}
		// Trusts only the signing CA: the successor published below is
		// not confirmed by it.
		ann[authority.TrustedCAsAnnotation] = signing
		if sig != nil {
			ann[authority.SignatureAnnotation] = base64.StdEncoding.EncodeToString(sig)
		}
		duration := int32(3600)
		now := metav1.NewMicroTime(time.Now())
		_, err := leases.Create(r.ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{authority.LeaseLabel: secret}, Annotations: ann},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &now},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	forge("zz-forged-b", "replica-b", genuine["replica-b"], foreignSig)
	forge("zz-made-up", "made-up-replica", genuine["replica-a"], nil)

	// A successor in the Secret, so that pending observers are reported.
	next, err := pki.NewCA(pki.Request{CommonName: "successor", Now: time.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := secretCA(t, admin, secret)
		s.Data[authority.NextCertKey], s.Data[authority.NextKeyKey] = next.CertPEM, next.KeyPEM
		s.Data[dynamiccert.SecretCAKey] = append(append([]byte{}, s.Data[dynamiccert.SecretCAKey]...), next.CertPEM...)
		_, err := admin.CoreV1().Secrets(cliNS).Update(r.ctx, s, metav1.UpdateOptions{})
		return err
	}))

	env := []string{"KUBECONFIG=" + kubeconfig}
	code, out := cli(t, env, "status", secret, "--webhook", "validating/forged-webhook", "-o", "json")
	assert.Equal(t, exitFailed, code, "Leases the Authority does not believe make status unhealthy")
	// Decoded by JSON name, so that the test reads any version's output.
	var rep struct {
		Healthy  bool
		Problems []string
		Replicas []struct {
			Lease, ID, LeafCA string
			Live, Verified    bool
			Rejection         *struct{ Reason, Message string }
		}
		Successor *struct{ PendingObservers []string }
		Targets   []struct {
			Verifies bool
			Replicas []struct{ Replica string }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep), "status -o json")
	assert.False(t, rep.Healthy)
	byLease := map[string]int{}
	for i, x := range rep.Replicas {
		byLease[x.Lease] = i
	}
	require.Len(t, rep.Replicas, 4, "two genuine Leases, two forged")
	for _, id := range []string{"replica-a", "replica-b"} {
		got := rep.Replicas[byLease[genuine[id].Name]]
		assert.Equal(t, id, got.ID)
		assert.True(t, got.Live && got.Verified, "%s is a live replica whose announcement verifies", id)
		assert.Nil(t, got.Rejection, "%s is not rejected", id)
		assert.Equal(t, signing, got.LeafCA, "%s serves a leaf of the signing CA", id)
	}
	forgedB := rep.Replicas[byLease["zz-forged-b"]]
	assert.False(t, forgedB.Verified, "the Lease signed by another key is not believed")
	if assert.NotNil(t, forgedB.Rejection, "the Lease signed by another key is rejected") {
		assert.Equal(t, "forged", forgedB.Rejection.Reason)
		assert.Contains(t, forgedB.Rejection.Message, "signature does not verify")
	}
	madeUp := rep.Replicas[byLease["zz-made-up"]]
	assert.False(t, madeUp.Verified, "the unsigned Lease is not believed")
	if assert.NotNil(t, madeUp.Rejection, "the unsigned Lease is rejected") {
		assert.Equal(t, "unsigned", madeUp.Rejection.Reason)
	}
	if assert.NotNil(t, rep.Successor) {
		assert.ElementsMatch(t, []string{"replica-a", "replica-b"}, rep.Successor.PendingObservers, "only believed replicas are pending observers")
	}
	if assert.Len(t, rep.Targets, 1) {
		assert.True(t, rep.Targets[0].Verifies)
		var checked []string
		for _, x := range rep.Targets[0].Replicas {
			checked = append(checked, x.Replica)
		}
		assert.ElementsMatch(t, []string{"replica-a", "replica-b"}, checked, "the webhook is checked against the believed replicas only")
	}
	problems := strings.Join(rep.Problems, "\n")
	assert.Contains(t, problems, "zz-forged-b")
	assert.Contains(t, problems, "zz-made-up")
	assert.NotContains(t, problems, "no CA in the Secret signed", "no genuine replica is reported serving an unknown leaf")

	code, out = cli(t, env, "status", secret)
	assert.Equal(t, exitFailed, code)
	for _, want := range []string{"REJECTED (forged)", "REJECTED (unsigned)", "Rejected announcements",
		"Lease zz-forged-b (holder replica-b): forged: the signature does not verify", "Lease zz-made-up (holder made-up-replica): unsigned"} {
		assert.Contains(t, out, want)
	}
}

// TestCLIRotateReplacesIgnoredMark: the Secret marks compromised a
// fingerprint that names no CA in it (mistyped by hand); the Authority
// ignores such a mark (a CARequestIgnored Event). rotate --compromised
// then marks the real CA, replacing the ignored mark and saying so,
// instead of refusing as if a request were pending.
func TestCLIRotateReplacesIgnoredMark(t *testing.T) {
	admin, kubeconfig := cliCluster(t)
	const secret = "mistyped-ca"
	ca, err := pki.NewCA(pki.Request{CommonName: "mistyped-ca", Now: time.Now(), Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	fp := authority.Fingerprint(ca.Cert)
	mistyped := fp[:len(fp)-1] + "0" // the last digit mistyped
	if mistyped == fp {
		mistyped = fp[:len(fp)-1] + "1"
	}
	_, err = admin.CoreV1().Secrets(cliNS).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret, Annotations: map[string]string{
			authority.CompromisedCAAnnotation: mistyped, authority.CompromisedReasonAnnotation: "typo",
		}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM, dynamiccert.SecretCAKey: ca.CertPEM},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	env := []string{"KUBECONFIG=" + kubeconfig}

	code, out := cli(t, env, "rotate", secret, "--compromised", "--reason", "key leaked")
	require.Equal(t, exitOK, code, "rotate --compromised after a mark the Authority ignored")
	assert.Contains(t, out, "replaced the earlier mark "+authority.CompromisedCAAnnotation+"="+mistyped)
	ann := secretCA(t, admin, secret).Annotations
	assert.Equal(t, fp, ann[authority.CompromisedCAAnnotation], "the real CA is marked")
	assert.Equal(t, "key leaked", ann[authority.CompromisedReasonAnnotation])
}

// gatedTransport fails every request while closed is set: a replica whose
// API calls stop (a partitioned node, a process frozen between renewals)
// while its Lease stays live.
type gatedTransport struct {
	next   http.RoundTripper
	closed *atomic.Bool
}

func (g gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if g.closed.Load() {
		return nil, errors.New("gated: this replica's API calls are cut off")
	}
	return g.next.RoundTrip(req)
}

// TestCLIRotateWaitSaysWhatItWaitsFor: three Authority replicas; one of
// them (replica-stuck) stops reaching the API server while its Lease stays
// live (10 minutes). rotate --compromised --wait then waits for the
// Authority's compromised-handled annotation, which the emergency rotation
// cannot reach while a live replica has not announced the successor.
// While it waits the CLI says so on stderr (which annotation, its value,
// and the live replicas that have not announced the successor), and its
// timeout error names replica-stuck and no other replica, instead of
// asking whether an Authority runs at all. Once replica-stuck reaches the
// API again, the wait ends. Before, the CLI printed nothing while it
// waited and its timeout named no replica.
func TestCLIRotateWaitSaysWhatItWaitsFor(t *testing.T) {
	admin, kubeconfig := cliCluster(t)
	r := newRunners(t)
	const secret = "waiting-ca"
	a := startReplica(t, r, admin, secret, "replica-a")
	b := startReplica(t, r, admin, secret, "replica-b")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	var cut atomic.Bool
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return gatedTransport{next: rt, closed: &cut} })
	stuck, err := authority.New(authority.Config{
		Namespace: cliNS, SecretName: secret, Client: kubernetes.NewForConfigOrDie(cfg), Hosts: []string{"webhook.test"},
		ReplicaID: "replica-stuck", LeaseDuration: 10 * time.Minute,
	})
	require.NoError(t, err)
	require.NoError(t, stuck.RunOnce(r.ctx))
	r.run(stuck)
	waitLeases(t, admin, secret, a, b, stuck)
	cut.Store(true)
	compromised := a.Status().Signing.Fingerprint
	env := []string{"KUBECONFIG=" + kubeconfig}

	code, out := cli(t, env, "rotate", secret, "--compromised", "--reason", "drill", "--wait", "--timeout", "20s")
	require.Equal(t, exitError, code, "rotate --wait while a live replica cannot announce the successor")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	timeout := lines[len(lines)-1]
	assert.Contains(t, timeout, "timed out after 20s waiting for the Authority to act: "+authority.CompromisedHandledAnnotation)
	assert.Contains(t, timeout, "replica-stuck", "the timeout names the replica the rotation waits for")
	assert.NotContains(t, timeout, "replica-a", "replica-a announced the successor")
	assert.NotContains(t, timeout, "replica-b", "replica-b announced the successor")
	assert.NotContains(t, timeout, "is an Authority running", "Authorities are running: the question misleads")
	var progress []string
	for _, l := range lines[:len(lines)-1] {
		if strings.Contains(l, "waiting for "+authority.CompromisedHandledAnnotation) {
			progress = append(progress, l)
		}
	}
	require.NotEmpty(t, progress, "progress lines while waiting")
	assert.Less(t, len(progress), 10, "at most every few seconds, backing off")
	assert.Contains(t, progress[len(progress)-1], "want "+compromised)
	assert.Contains(t, progress[len(progress)-1], "replica-stuck")

	// replica-stuck reaches the API server again once rotate --wait below
	// has re-marked the CA and waits: it announces the successor, the
	// emergency rotation completes and the wait ends. (Reaching the API
	// before the CLI reads the Secret would race: once the emergency has
	// promoted the successor, rotate --compromised without --ca names that
	// one, and the CLI refuses while the first mark is pending.)
	markedAt := secretCA(t, admin, secret).Annotations[authority.CompromisedAtAnnotation]
	time.Sleep(1100 * time.Millisecond) // the CLI's mark carries a later second
	go func() {
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			s, err := admin.CoreV1().Secrets(cliNS).Get(context.Background(), secret, metav1.GetOptions{})
			if err == nil && s.Annotations[authority.CompromisedAtAnnotation] != markedAt {
				break
			}
		}
		cut.Store(false)
	}()
	code, out = cli(t, env, "rotate", secret, "--compromised", "--reason", "drill", "--wait", "--timeout", "2m")
	require.Equal(t, exitOK, code, "rotate --wait once every live replica can act: %s", out)
	assert.Equal(t, compromised, secretCA(t, admin, secret).Annotations[authority.CompromisedHandledAnnotation])
}
