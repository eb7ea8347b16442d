//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/example/webhook/app"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/internal/tlstest"
)

const (
	// webhookEnabledNS is labelled evercert.io/webhook=enabled; the rule
	// applies there. webhookDisabledNS is not.
	webhookEnabledNS  = "webhook-enabled"
	webhookDisabledNS = "webhook-disabled"
	webhookUser       = "webhook"
	webhookCASecret   = "webhook-ca"
)

// webhookNamespaces creates the CA Secret's namespace (ns) and the two
// namespaces ConfigMaps are created in.
func webhookNamespaces(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	setupNamespace(t, admin)
	for name, labels := range map[string]map[string]string{
		webhookEnabledNS:  {app.EnabledNamespaceLabel: app.EnabledNamespaceValue},
		webhookDisabledNS: nil,
	} {
		_, err := admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
}

// startWebhookReplica runs the example webhook in-process on a free port of
// 127.0.0.1, with the CA in ns/webhookCASecret and the flags args, and
// registers it by URL. It is stopped when the test ends.
func startWebhookReplica(t *testing.T, kubeconfig string, args ...string) *app.Webhook {
	t.Helper()
	return runWebhookApp(t, append([]string{
		"--bind-address=127.0.0.1", "--secure-port=0",
		"--kubeconfig=" + kubeconfig, "--ca-secret=" + ns + "/" + webhookCASecret,
		"--self-signed-hosts=evercert-example-webhook." + ns + ".svc,127.0.0.1",
		"--register-url=https://127.0.0.1",
	}, args...)...)
}

// runWebhookApp runs the example webhook in-process with exactly the flags
// args. It is stopped when the test ends.
func runWebhookApp(t *testing.T, args ...string) *app.Webhook {
	t.Helper()
	opts := app.NewOptions()
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
	opts.AddFlags(fs)
	require.NoError(t, fs.Parse(args))
	opts.ShutdownTimeout = 2 * time.Second
	w, err := app.New(opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "webhook replica")
		case <-time.After(15 * time.Second):
			t.Error("webhook replica did not stop within 15s")
		}
	})
	return w
}

func waitReady(t *testing.T, replicas ...*app.Webhook) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for i, w := range replicas {
		select {
		case <-w.Ready():
		case <-timeout:
			t.Fatalf("webhook replica %d not ready within 30s", i)
		}
	}
}

// newConfigMap returns a ConfigMap, with the required label or without.
func newConfigMap(name string, labelled bool) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v"}}
	if labelled {
		cm.Labels = map[string]string{app.RequiredLabel: "e2e"}
	}
	return cm
}

// isDenial reports whether err is the validating webhook denying a
// ConfigMap for the missing label.
func isDenial(err error) bool {
	return apierrors.IsForbidden(err) &&
		strings.Contains(err.Error(), fmt.Sprintf("admission webhook %q denied the request", app.ValidatingWebhookName)) &&
		strings.Contains(err.Error(), `must carry the label "app"`)
}

// TestE2EWebhookAdmission registers the webhook by URL against a real
// kube-apiserver, which calls it through the published caBundle: a
// ConfigMap without the label is denied, one with it is admitted and
// mutated. Then the caBundle is overwritten by hand (drift) and repaired.
func TestE2EWebhookAdmission(t *testing.T) {
	t.Parallel() // reads no process-global metric: see main_test.go
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: webhookUser}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	webhookNamespaces(t, admin)
	applyWebhookRBAC(t, admin, webhookUser, webhookCASecret, app.DefaultConfigurationName)
	kubeconfig := writeKubeconfig(t, cluster.UserConfig(webhookUser))

	start := time.Now()
	w := startWebhookReplica(t, kubeconfig)
	waitReady(t, w)
	t.Logf("webhook registered and caBundle published %v after start", time.Since(start).Round(time.Millisecond))

	ctx := context.Background()
	secret, err := admin.CoreV1().Secrets(ns).Get(ctx, webhookCASecret, metav1.GetOptions{})
	require.NoError(t, err)
	vwc, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, app.DefaultConfigurationName, metav1.GetOptions{})
	require.NoError(t, err)
	mwc, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, app.DefaultConfigurationName, metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, vwc.Webhooks, 1)
	require.Len(t, mwc.Webhooks, 1)
	base := "https://" + w.Addr().String()
	assert.Equal(t, base+app.ValidatePath, *vwc.Webhooks[0].ClientConfig.URL)
	assert.Equal(t, base+app.MutatePath, *mwc.Webhooks[0].ClientConfig.URL)
	assert.Equal(t, string(secret.Data["ca.crt"]), string(vwc.Webhooks[0].ClientConfig.CABundle), "validating caBundle is the CA Secret's ca.crt")
	assert.Equal(t, string(secret.Data["ca.crt"]), string(mwc.Webhooks[0].ClientConfig.CABundle), "mutating caBundle is the CA Secret's ca.crt")

	// The replica is ready over HTTPS, verified with the published bundle.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tlstest.Pool(t, vwc.Webhooks[0].ClientConfig.CABundle)}}}
	resp, err := hc.Get(base + "/readyz?verbose")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), "[+]cabundle-published ok")

	enabled := admin.CoreV1().ConfigMaps(webhookEnabledNS)
	_, err = enabled.Create(ctx, newConfigMap("no-label", false), metav1.CreateOptions{})
	require.Error(t, err)
	assert.True(t, isDenial(err), "want a denial for the missing label, got: %v", err)
	t.Logf("denied as expected: %v", err)

	cm, err := enabled.Create(ctx, newConfigMap("labelled", true), metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, "true", cm.Annotations[app.DefaultedAnnotation], "mutated on create")

	preset := newConfigMap("preset", true)
	preset.Annotations = map[string]string{app.DefaultedAnnotation: "no", "other": "x"}
	cm2, err := enabled.Create(ctx, preset, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{app.DefaultedAnnotation: "no", "other": "x"}, cm2.Annotations, "an existing annotation is left alone")

	// UPDATE is covered too: removing the label is denied.
	cm.Labels = nil
	_, err = enabled.Update(ctx, cm, metav1.UpdateOptions{})
	assert.True(t, isDenial(err), "want a denial for removing the label, got: %v", err)

	// Namespaces without the label are not the webhook's business.
	other, err := admin.CoreV1().ConfigMaps(webhookDisabledNS).Create(ctx, newConfigMap("no-label", false), metav1.CreateOptions{})
	require.NoError(t, err)
	assert.NotContains(t, other.Annotations, app.DefaultedAnnotation)

	t.Run("drift", func(t *testing.T) {
		want := w.CABundle()
		foreign, err := pki.NewCA(pki.Request{CommonName: "someone-else", Now: time.Now(), Lifetime: time.Hour})
		require.NoError(t, err)
		vwcs := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations()
		cur, err := vwcs.Get(ctx, app.DefaultConfigurationName, metav1.GetOptions{})
		require.NoError(t, err)
		cur.Webhooks[0].ClientConfig.CABundle = foreign.CertPEM
		_, err = vwcs.Update(ctx, cur, metav1.UpdateOptions{})
		require.NoError(t, err)
		overwritten := time.Now()

		require.Eventually(t, func() bool {
			got, err := vwcs.Get(ctx, app.DefaultConfigurationName, metav1.GetOptions{})
			return err == nil && bytes.Equal(got.Webhooks[0].ClientConfig.CABundle, want)
		}, 10*time.Second, 20*time.Millisecond, "caBundle repaired")
		repaired := time.Since(overwritten)
		assert.Less(t, repaired, 5*time.Second, "repaired within a few seconds")

		// Admissions work again once the API server has seen the repair
		// (its informer follows within milliseconds), and keep working.
		i := 0
		require.Eventually(t, func() bool {
			i++
			_, err := enabled.Create(ctx, newConfigMap(fmt.Sprintf("after-drift-probe-%d", i), true), metav1.CreateOptions{})
			return err == nil
		}, 5*time.Second, 50*time.Millisecond, "admissions after the repair")
		recovered := time.Since(overwritten)
		for i := range 20 {
			cm, err := enabled.Create(ctx, newConfigMap(fmt.Sprintf("after-drift-%d", i), true), metav1.CreateOptions{})
			if assert.NoError(t, err) {
				assert.Equal(t, "true", cm.Annotations[app.DefaultedAnnotation])
			}
		}
		_, err = enabled.Create(ctx, newConfigMap("after-drift-no-label", false), metav1.CreateOptions{})
		assert.True(t, isDenial(err), "want a denial, got: %v", err)
		t.Logf("drift: caBundle repaired %v after the overwrite, admissions working %v after it (%d probes)",
			repaired.Round(time.Millisecond), recovered.Round(time.Millisecond), i)
	})
}

// caSecretWatch follows the CA Secret and checks, at every write, that it
// holds exactly one signing CA, which is in the bundle.
type caSecretWatch struct {
	mu        sync.Mutex
	writes    int
	signing   map[string]bool // distinct tls.crt
	maxBundle int
	problems  []string
	ended     bool
}

func watchCASecret(t *testing.T, admin kubernetes.Interface) *caSecretWatch {
	t.Helper()
	w, err := admin.CoreV1().Secrets(ns).Watch(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=" + webhookCASecret})
	require.NoError(t, err)
	t.Cleanup(w.Stop)
	s := &caSecretWatch{signing: map[string]bool{}}
	go func() {
		defer func() { s.mu.Lock(); s.ended = true; s.mu.Unlock() }()
		for ev := range w.ResultChan() {
			secret, ok := ev.Object.(*corev1.Secret)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			s.observe(secret)
		}
	}()
	return s
}

func (s *caSecretWatch) observe(secret *corev1.Secret) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	problem := func(format string, args ...any) {
		s.problems = append(s.problems, fmt.Sprintf("rv %s: ", secret.ResourceVersion)+fmt.Sprintf(format, args...))
	}
	signing, err := pki.ParseCABundle(secret.Data["tls.crt"])
	if err != nil || len(signing) != 1 {
		problem("tls.crt holds %d certificates (err %v), want exactly one signing CA", len(signing), err)
		return
	}
	s.signing[string(secret.Data["tls.crt"])] = true
	bundle, err := pki.ParseCABundle(secret.Data["ca.crt"])
	if err != nil {
		problem("ca.crt: %v", err)
		return
	}
	s.maxBundle = max(s.maxBundle, len(bundle))
	found := false
	for _, c := range bundle {
		found = found || c.Equal(signing[0])
	}
	if !found {
		problem("the signing CA is not in ca.crt")
	}
	if next := secret.Data["next.crt"]; len(next) > 0 {
		if certs, err := pki.ParseCABundle(next); err != nil || len(certs) != 1 {
			problem("next.crt holds %d certificates (err %v)", len(certs), err)
		}
	}
}

// caBundleWatch counts the distinct caBundles a ValidatingWebhookConfiguration
// went through.
type caBundleWatch struct {
	mu        sync.Mutex
	bundles   map[string]bool
	maxBundle int
}

func watchValidatingCABundle(t *testing.T, admin kubernetes.Interface, name string) *caBundleWatch {
	t.Helper()
	w, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Watch(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	require.NoError(t, err)
	t.Cleanup(w.Stop)
	b := &caBundleWatch{bundles: map[string]bool{}}
	go func() {
		for ev := range w.ResultChan() {
			cfg, ok := ev.Object.(*admissionregistrationv1.ValidatingWebhookConfiguration)
			if !ok || len(cfg.Webhooks) == 0 || len(cfg.Webhooks[0].ClientConfig.CABundle) == 0 {
				continue
			}
			certs, _ := pki.ParseCABundle(cfg.Webhooks[0].ClientConfig.CABundle)
			b.mu.Lock()
			b.bundles[string(cfg.Webhooks[0].ClientConfig.CABundle)] = true
			b.maxBundle = max(b.maxBundle, len(certs))
			b.mu.Unlock()
		}
	}()
	return b
}

// TestE2EWebhookRotation runs three replicas sharing one CA Secret, with
// lifetimes of seconds, each serving its own webhook configuration (A a
// validating one, B the mutating one, C a second validating one), so every
// ConfigMap create goes through all three. ConfigMaps are created at 20/s
// for a minute, through several CA rotations: not a single admission may
// fail.
func TestE2EWebhookRotation(t *testing.T) {
	const (
		loadDuration    = 60 * time.Second
		rate            = 20 // creates per second
		workers         = 4
		unlabelledEvery = 25 // every 25th ConfigMap has no label and must be denied
	)
	cluster := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: webhookUser}))
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	webhookNamespaces(t, admin)
	applyWebhookRBAC(t, admin, webhookUser, webhookCASecret, "webhook-a", "webhook-b", "webhook-c")
	kubeconfig := writeKubeconfig(t, cluster.UserConfig(webhookUser))

	secretWatch := watchCASecret(t, admin)
	bundleWatch := watchValidatingCABundle(t, admin, "webhook-a")

	// The leaf lives 2 s (renewed at 2/3); server.Options derives the CA
	// lifetimes from it: CA 16 s, renewed 5.3 s before expiry, a successor
	// signs 2.3 s after it joined the bundle. So the CA rotates every
	// ~10.7 s: five or six times in a minute.
	lifetimes := []string{"--self-signed-validity=2s"}
	replicaA := startWebhookReplica(t, kubeconfig, append(lifetimes, "--validating-webhook-configuration=webhook-a", "--mutating-webhook-configuration=")...)
	replicaB := startWebhookReplica(t, kubeconfig, append(lifetimes, "--validating-webhook-configuration=", "--mutating-webhook-configuration=webhook-b")...)
	replicaC := startWebhookReplica(t, kubeconfig, append(lifetimes, "--validating-webhook-configuration=webhook-c", "--mutating-webhook-configuration=")...)
	waitReady(t, replicaA, replicaB, replicaC)

	publishErrorsBefore := publishErrors(t)
	ctx := context.Background()
	cms := admin.CoreV1().ConfigMaps(webhookEnabledNS)
	var admitted, denied, failed, behind atomic.Int64
	var failMu sync.Mutex
	var failures []string
	work := make(chan int, 2*workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range work {
				labelled := i%unlabelledEvery != 0
				reqCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
				cm, err := cms.Create(reqCtx, newConfigMap(fmt.Sprintf("load-%05d", i), labelled), metav1.CreateOptions{})
				cancel()
				var problem string
				switch {
				case labelled && err != nil:
					problem = fmt.Sprintf("load-%05d (labelled): %v", i, err)
				case labelled && cm.Annotations[app.DefaultedAnnotation] != "true":
					problem = fmt.Sprintf("load-%05d (labelled): admitted but not mutated: annotations %v", i, cm.Annotations)
				case labelled:
					admitted.Add(1)
				case isDenial(err):
					denied.Add(1)
				default:
					problem = fmt.Sprintf("load-%05d (no label): want a denial, got err %v", i, err)
				}
				if problem != "" {
					failed.Add(1)
					failMu.Lock()
					failures = append(failures, time.Now().Format("15:04:05.000")+" "+problem)
					failMu.Unlock()
				}
			}
		})
	}
	// Create i is due at began + i/rate. A late scheduler catches up
	// rather than skipping; workers that fall behind slow the load down
	// (blocking send), which the rate check below would show.
	began := time.Now()
	for i := 0; ; i++ {
		due := began.Add(time.Duration(i) * time.Second / rate)
		if due.Sub(began) >= loadDuration || time.Since(began) > loadDuration+30*time.Second {
			break
		}
		time.Sleep(time.Until(due))
		select {
		case work <- i:
		default:
			behind.Add(1)
			work <- i
		}
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(began)

	secretWatch.mu.Lock()
	writes, generations, maxBundle, problems, ended := secretWatch.writes, len(secretWatch.signing), secretWatch.maxBundle, secretWatch.problems, secretWatch.ended
	secretWatch.mu.Unlock()
	bundleWatch.mu.Lock()
	caBundles, maxCABundle := len(bundleWatch.bundles), bundleWatch.maxBundle
	bundleWatch.mu.Unlock()
	rotations := generations - 1
	creates := admitted.Load() + denied.Load() + failed.Load()
	t.Logf("webhook rotation report: %d creates in %v (%d admitted and mutated, %d denied as expected, workers behind %d times), %d failures, "+
		"%d CA rotations (%d signing CAs), %d CA Secret writes, max ca.crt %d certs, webhook-a caBundle values %d (max %d certs), caBundle publish errors %v",
		creates, elapsed.Round(time.Millisecond), admitted.Load(), denied.Load(), behind.Load(), failed.Load(),
		rotations, generations, writes, maxBundle, caBundles, maxCABundle, publishErrors(t)-publishErrorsBefore)

	for i, f := range failures {
		if i == 20 {
			t.Errorf("... and %d more failures", len(failures)-i)
			break
		}
		t.Errorf("failed admission: %s", f)
	}
	assert.Zero(t, failed.Load(), "failed admissions")
	assert.GreaterOrEqual(t, creates, int64(rate*loadDuration/time.Second*8/10), "the load ran at about the intended rate")
	assert.Positive(t, denied.Load(), "unlabelled ConfigMaps were denied")
	assert.False(t, ended, "the CA Secret watch ended early; counts are incomplete")
	assert.Empty(t, problems, "CA Secret invariants")
	assert.GreaterOrEqual(t, rotations, 3, "CA rotations")
	assert.GreaterOrEqual(t, maxBundle, 2, "ca.crt held the old and the new CA together")
	assert.GreaterOrEqual(t, maxCABundle, 2, "the published caBundle held the old and the new CA together")
	// Each CA costs at most three writes (join the bundle, start signing,
	// leave the bundle), plus the creation; replicas undoing each other's
	// writes would be far more.
	assert.LessOrEqual(t, writes, 3*generations+3, "CA Secret writes (no ping-pong between replicas)")
	assert.Zero(t, publishErrors(t)-publishErrorsBefore, "caBundle publish errors")
}

// publishErrors sums evercert_cabundle_publish_total{result="error"} over
// the webhook kinds (the replicas run in this process).
func publishErrors(t *testing.T) float64 {
	var sum float64
	for _, kind := range []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"} {
		sum += certmetricstest.Value(t, "evercert_cabundle_publish_total", map[string]string{"kind": kind, "result": "error"})
	}
	return sum
}
