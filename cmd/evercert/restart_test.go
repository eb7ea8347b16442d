//go:build e2e

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/tlstest"
)

// servingLine is the example server's log line naming the address it
// listens on.
var servingLine = regexp.MustCompile(`serving on https://([0-9.:\[\]a-f]+)`)

// TestCLIRotateCompromisedAfterRestarts: an emergency right after the
// replicas restarted, as users run it. Two example servers (separate
// processes, POD_NAME set as the downward API sets it, the default lease
// and renewal settings: a 3-minute lease) serve leaves of one CA Secret.
// One is SIGKILLed and started again under the same POD_NAME (a container
// restart in its pod); the other is stopped with SIGTERM and replaced by a
// process under a new POD_NAME (a rolling update's new pod). Once both new
// processes are ready, rotate --compromised --wait with its default
// timeout (2 minutes) returns exit 0: the compromised CA is gone from
// ca.crt, and each replica's leaf verifies against the new ca.crt and was
// not signed by the compromised CA. Before (a random replica ID per
// process, and a stopped replica's Lease left behind), each new process
// counted the Leases of the two stopped ones as live replicas for a full
// lease duration after it first saw them, the emergency waited for them
// (about 200 s in field trial 4), and the CLI's wait ran out first.
func TestCLIRotateCompromisedAfterRestarts(t *testing.T) {
	admin, kubeconfig := cliCluster(t)
	const secret = "restart-ca"
	bin := proctest.Build(t, "github.com/evercert/evercert/example/server")
	// The default lease (3 minutes) and renewal settings, as deployed: the
	// lease duration is what a stale Lease costs. The loopback self-check
	// is off: it calls each server every second and has nothing to do with
	// the Lease.
	start := func(podName string) *serverProcess {
		t.Helper()
		return startServer(t, bin, podName, "--bind-address=127.0.0.1", "--secure-port=0", "--kubeconfig="+kubeconfig,
			"--ca-secret="+cliNS+"/"+secret, "--loopback-selfcheck-interval=0")
	}

	// 1. Two replicas, each announcing the leaf it serves in its Lease.
	r0 := start("server-0")
	waitReadyz(t, admin, secret, r0)
	r1 := start("server-1")
	waitReadyz(t, admin, secret, r1)
	waitAnnounced(t, admin, secret, func() []string {
		return []string{servedSerial(t, admin, secret, r0), servedSerial(t, admin, secret, r1)}
	})

	// 2. server-0's container crashes and restarts in the same pod;
	// server-1 is replaced by a rolling update's new pod.
	r0.Kill(t)
	r0 = start("server-0")
	require.Zero(t, r1.Terminate(t), "server-1 exits 0 on SIGTERM")
	r2 := start("server-2")
	waitReadyz(t, admin, secret, r0, r2)
	logLeases(t, admin, secret)

	// 3. The emergency, with the CLI's default --wait.
	before := secretCA(t, admin, secret)
	compromised := parseCertPEM(before.Data[corev1.TLSCertKey])
	require.NotNil(t, compromised, "the signing CA in tls.crt")
	fp := authority.Fingerprint(compromised)
	markToHandled := watchMarkToHandled(t, admin, secret, before.ResourceVersion, fp)
	proctest.Build(t, "github.com/evercert/evercert/cmd/evercert") // built before the clock starts
	began := time.Now()
	code, out := cli(t, []string{"KUBECONFIG=" + kubeconfig}, "rotate", secret, "--compromised", "--reason", "drill after restarts", "--wait")
	took := time.Since(began)
	require.Equal(t, exitOK, code, "rotate --compromised --wait (default --timeout) after the replicas restarted: %s", out)
	after := secretCA(t, admin, secret)
	assert.Equal(t, fp, after.Annotations[authority.CompromisedHandledAnnotation])
	bundle, err := pki.ParseCABundle(after.Data[dynamiccert.SecretCAKey])
	require.NoError(t, err)
	for _, c := range bundle {
		assert.NotEqual(t, fp, authority.Fingerprint(c), "the compromised CA is gone from %s", dynamiccert.SecretCAKey)
	}
	roots := tlstest.Pool(t, after.Data[dynamiccert.SecretCAKey])
	for _, r := range []*serverProcess{r0, r2} {
		leaf, err := tlstest.Dial(r.addr, &tls.Config{ServerName: "127.0.0.1", RootCAs: roots})
		if assert.NoError(t, err, "%s's leaf verifies against the new %s", r.podName, dynamiccert.SecretCAKey) {
			assert.Error(t, leaf.CheckSignatureFrom(compromised), "%s serves a leaf of the compromised CA", r.podName)
		}
	}

	// 4. The figure for the note (not asserted on).
	select {
	case d := <-markToHandled:
		t.Logf("emergency after restarts: %s recorded %v after the mark (watch on the Secret); rotate --wait returned after %v",
			authority.CompromisedHandledAnnotation, d.Round(time.Millisecond), took.Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Errorf("the watch on the Secret saw no %s within 10s of the CLI seeing it", authority.CompromisedHandledAnnotation)
	}
}

// serverProcess is an example server process and what it was started as.
type serverProcess struct {
	*proctest.Process
	podName, addr string
}

// startServer runs the example server bin with args as the pod podName
// would (POD_NAME set, as the downward API sets it) in a minimal
// environment (nothing of this machine's: no KUBECONFIG, no POD_NAME of its
// own), and returns once it listens.
func startServer(t *testing.T, bin, podName string, args ...string) *serverProcess {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH"), authority.PodNameEnv + "=" + podName}
	p, addr := proctest.StartCmd(t, cmd, servingLine)
	return &serverProcess{Process: p, podName: podName, addr: addr}
}

// waitReadyz waits until each server's /readyz answers 200 to a client
// that trusts the Secret's ca.crt, as a readiness probe would (the kubelet's
// does not verify; this one does, so a server ready on a CA the Secret does
// not publish is not counted ready).
func waitReadyz(t *testing.T, admin kubernetes.Interface, secret string, servers ...*serverProcess) {
	t.Helper()
	for _, s := range servers {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got, err := admin.CoreV1().Secrets(cliNS).Get(context.Background(), secret, metav1.GetOptions{})
			if !assert.NoError(c, err) {
				return
			}
			pool := x509.NewCertPool()
			if !assert.True(c, pool.AppendCertsFromPEM(got.Data[dynamiccert.SecretCAKey]), "a CA in %s", dynamiccert.SecretCAKey) {
				return
			}
			client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{ServerName: "127.0.0.1", RootCAs: pool}}}
			defer client.CloseIdleConnections()
			resp, err := client.Get("https://" + s.addr + "/readyz")
			if !assert.NoError(c, err) {
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			assert.Equal(c, http.StatusOK, resp.StatusCode, "/readyz: %s", body)
		}, time.Minute, 100*time.Millisecond, "%s (%s) ready", s.podName, s.addr)
	}
}

// servedSerial returns the serial (hexadecimal) of the leaf s serves,
// verified against the Secret's ca.crt, or "" when the handshake fails.
func servedSerial(t *testing.T, admin kubernetes.Interface, secret string, s *serverProcess) string {
	t.Helper()
	got, err := admin.CoreV1().Secrets(cliNS).Get(context.Background(), secret, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(got.Data[dynamiccert.SecretCAKey])
	leaf, err := tlstest.Dial(s.addr, &tls.Config{ServerName: "127.0.0.1", RootCAs: pool})
	if err != nil {
		return ""
	}
	return leaf.SerialNumber.Text(16)
}

// logLeases logs the Leases of secret's replicas: the holder and renewal of
// each, what a replica that starts now finds.
func logLeases(t *testing.T, admin kubernetes.Interface, secret string) {
	t.Helper()
	list, err := admin.CoordinationV1().Leases(cliNS).List(context.Background(), metav1.ListOptions{LabelSelector: authority.LeaseSelector(secret)})
	if err != nil {
		t.Logf("listing the Leases of %s: %v", secret, err)
		return
	}
	var held []string
	for _, l := range list.Items {
		holder, renewed := "", ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		if l.Spec.RenewTime != nil {
			renewed = l.Spec.RenewTime.UTC().Format(time.RFC3339)
		}
		held = append(held, l.Name+" (holder "+holder+", renewed "+renewed+")")
	}
	slices.Sort(held)
	t.Logf("Leases of %s after the restarts: %d: %s", secret, len(held), strings.Join(held, "; "))
}

// watchMarkToHandled watches the Secret from resourceVersion rv until the
// test ends, and sends on the returned channel the time from the first
// event whose compromised-ca annotation is fp to the first whose
// compromised-handled annotation is fp, both on this machine's clock.
func watchMarkToHandled(t *testing.T, admin kubernetes.Interface, secret, rv, fp string) <-chan time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := admin.CoreV1().Secrets(cliNS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + secret, ResourceVersion: rv})
	require.NoError(t, err, "watching the Secret %s", secret)
	got := make(chan time.Duration, 1)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	go func() {
		defer close(done)
		var marked time.Time
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*corev1.Secret)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			now := time.Now()
			if marked.IsZero() && s.Annotations[authority.CompromisedCAAnnotation] == fp {
				marked = now
			}
			if !marked.IsZero() && s.Annotations[authority.CompromisedHandledAnnotation] == fp {
				got <- now.Sub(marked)
				return
			}
		}
	}()
	return got
}
