//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"

	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/testcluster"
)

// TestE2ECABundleReplicaRotation runs three replicas of one caBundle
// publisher (one field manager, the default) against a real kube-apiserver,
// each reading its CA bundle from a Secret through a watch, and steps the
// bundle through a CA rotation ([A] -> [A B] -> [B]) with the replicas'
// sources a second apart, as the watches of pods reading one Secret may be.
// Before the fix, the replicas behind counted the replica ahead's write as
// another writer's and wrote their older bundle back: one rotation step
// made the object contested (Warning Event, failing health, writes held
// back). Now no replica is contested at any time, no CABundleContested
// Event or contested count appears, and the object ends holding [B].
//
// Then the negative: another field manager writing a bundle that is a later
// step of the publisher's rotation (its CA plus a newer one) is still
// another writer, contested and named.
func TestE2ECABundleReplicaRotation(t *testing.T) {
	cluster := testcluster.Start(t)
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	setupNamespace(t, admin)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: admin.EventsV1()})
	require.NoError(t, broadcaster.StartRecordingToSinkWithContext(ctx))
	t.Cleanup(broadcaster.Shutdown)
	recorder := broadcaster.NewRecorder(scheme.Scheme, "evercert-e2e")

	now := time.Now()
	a, b, c := rotationCA(t, "a", now.Add(-2*time.Hour)), rotationCA(t, "b", now.Add(-time.Hour)), rotationCA(t, "c", now)
	join := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	const (
		replicas = 3
		stagger  = time.Second
		name     = "evercert-e2e-replica-rotation"
		rivalled = "evercert-e2e-rival-ahead"
	)
	mwcs := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	for _, n := range []string{name, rivalled} {
		_, err := mwcs.Create(ctx, inertMutatingWebhook(n), metav1.CreateOptions{})
		require.NoError(t, err)
	}
	run := func(r interface{ Run(context.Context, int) }) {
		wg.Go(func() { r.Run(ctx, 1) })
	}
	start := func(pname string, source dynamiccertificates.CAContentProvider, target string) *cabundle.Publisher {
		p, err := cabundle.NewPublisher(cabundle.PublisherConfig{
			Name: pname, Source: source, KubeConfig: cluster.Config(), EventRecorder: recorder,
			Targets: []cabundle.Target{{Kind: cabundle.MutatingWebhookConfiguration, Name: target}},
		})
		require.NoError(t, err)
		run(p)
		return p
	}
	holds := func(n string, want []byte) bool {
		o, err := mwcs.Get(ctx, n, metav1.GetOptions{})
		require.NoError(t, err)
		return bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, want)
	}
	contestedCount := func() float64 {
		return certmetricstest.Value(t, "evercert_cabundle_publish_total",
			map[string]string{"kind": string(cabundle.MutatingWebhookConfiguration), "result": "contested"})
	}

	// Each replica follows its own Secret: one Secret as three pods'
	// watches deliver it, a second apart.
	secrets := admin.CoreV1().Secrets(ns)
	setCA := func(i int, bundle []byte) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			s, err := secrets.Get(ctx, fmt.Sprintf("ca-%d", i), metav1.GetOptions{})
			if err != nil {
				return err
			}
			s.Data = map[string][]byte{dynamiccert.SecretCAKey: bundle}
			_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
			return err
		})
		require.NoError(t, err)
	}
	var pubs []*cabundle.Publisher
	for i := range replicas {
		_, err := secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ca-%d", i)},
			Data:       map[string][]byte{dynamiccert.SecretCAKey: a},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		source, err := dynamiccert.NewSecretCA(dynamiccert.SecretConfig{
			Name: fmt.Sprintf("replica-%d-ca", i), Namespace: ns, SecretName: fmt.Sprintf("ca-%d", i), Client: admin,
		})
		require.NoError(t, err)
		require.NoError(t, source.RunOnce(ctx))
		run(source)
		pubs = append(pubs, start(fmt.Sprintf("replica-%d", i), source, name))
	}
	require.Eventually(t, func() bool {
		for _, p := range pubs {
			if !p.HasSynced() {
				return false
			}
		}
		return holds(name, a)
	}, 30*time.Second, 50*time.Millisecond, "replicas published [A]")
	contestedBefore := contestedCount()

	// Watch every replica's contested state and health through the
	// rotation and after it; the first problem of each replica is kept.
	var mu sync.Mutex
	problems := map[int]string{}
	note := func(i int, problem string) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := problems[i]; !ok {
			problems[i] = problem
		}
	}
	watchCtx, stopWatching := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			for i, p := range pubs {
				if got := p.Contested(); len(got) > 0 {
					note(i, fmt.Sprintf("contested %v", got))
				}
				if err := p.HealthCheck().Check(nil); err != nil {
					note(i, "health: "+err.Error())
				}
			}
			select {
			case <-watchCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	began := time.Now()
	for _, step := range [][]byte{join(a, b), b} {
		for i := range replicas {
			setCA(i, step)
			// Pacing: the next replica's source sees the step a second
			// later. What is asserted is state, not timing.
			time.Sleep(stagger)
		}
	}
	require.Eventually(t, func() bool { return holds(name, b) }, 30*time.Second, 50*time.Millisecond, "the object holds [B]")
	converged := time.Since(began)
	// The replicas ahead's writes are seen by the others' informers, and
	// health would fail for contestQuiet (30 s) had any contest started;
	// a few more seconds of watching cover late events.
	time.Sleep(3 * time.Second)
	stopWatching()
	<-watched
	t.Logf("rotation of 2 steps over %d replicas (%v apart, %v of pacing) converged on [B] %v after the first step",
		replicas, stagger, 2*replicas*stagger, converged.Round(time.Millisecond))
	mu.Lock()
	assert.Empty(t, problems, "replica contested or unhealthy during the rotation")
	mu.Unlock()
	assert.True(t, holds(name, b), "the object still holds [B]")
	assert.Zero(t, contestedCount()-contestedBefore, "evercert_cabundle_publish_total{result=contested} during the rotation")

	// The negative: another field manager writing a later step of the
	// publisher's rotation ([B C] next to our [B]) is another writer.
	static, err := dynamiccert.NewStaticCA("rival-target-ca", b)
	require.NoError(t, err)
	p := start("rivalled", static, rivalled)
	require.Eventually(t, func() bool { return holds(rivalled, b) }, 30*time.Second, 50*time.Millisecond, "published [B]")
	rivalCtx, stopRival := context.WithCancel(ctx)
	rivalDone := make(chan struct{})
	go func() {
		defer close(rivalDone)
		rival(rivalCtx, admin, rivalled, join(b, c), "rival")
	}()
	t.Cleanup(func() { stopRival(); <-rivalDone })
	require.Eventually(t, func() bool { return len(p.Contested()) == 1 }, 60*time.Second, 50*time.Millisecond,
		"another field manager writing a later step of our rotation makes the object contested")
	err = p.HealthCheck().Check(nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rival")
	stopRival()
	<-rivalDone

	// The Events reached the cluster: the rival's contest, and none about
	// the rotated object (the recorder sends in order, so the rotation's
	// would have arrived before this one).
	require.Eventually(t, func() bool {
		return len(contestedEvents(t, admin, rivalled)) > 0
	}, 30*time.Second, 100*time.Millisecond, "CABundleContested Event about the rivalled object")
	for _, e := range contestedEvents(t, admin, rivalled) {
		assert.Contains(t, e.Note, "rival")
	}
	assert.Empty(t, contestedEvents(t, admin, name), "CABundleContested Events about the rotated object")
}

// rotationCA returns the PEM of a fresh CA issued at now.
func rotationCA(t *testing.T, name string, now time.Time) []byte {
	t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: "rotation-" + name, Now: now, Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	return ca.CertPEM
}

// inertMutatingWebhook is a MutatingWebhookConfiguration with one webhook
// that matches no request (a made-up group) and no caBundle yet.
func inertMutatingWebhook(name string) *admissionregistrationv1.MutatingWebhookConfiguration {
	none := admissionregistrationv1.SideEffectClassNone
	ignore := admissionregistrationv1.Ignore
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "inert.evercert.test",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: "inert"},
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"inert.evercert.test"}, APIVersions: []string{"v1"}, Resources: []string{"inert"}},
			}},
			SideEffects:             &none,
			FailurePolicy:           &ignore,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

// rival writes theirs into the first webhook's caBundle of the named
// MutatingWebhookConfiguration, under its own field manager, whenever it
// holds anything else (polled every 100 ms), until ctx is done.
func rival(ctx context.Context, admin kubernetes.Interface, name string, theirs []byte, manager string) {
	mwcs := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		// Errors (a conflict with the publisher's write) are retried at
		// the next tick.
		if o, err := mwcs.Get(ctx, name, metav1.GetOptions{}); err == nil && !bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, theirs) {
			o.Webhooks[0].ClientConfig.CABundle = theirs
			_, _ = mwcs.Update(ctx, o, metav1.UpdateOptions{FieldManager: manager})
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// contestedEvents lists the CABundleContested Events about the named
// MutatingWebhookConfiguration.
func contestedEvents(t *testing.T, admin kubernetes.Interface, name string) []eventsv1.Event {
	t.Helper()
	list, err := admin.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Reason == "CABundleContested" && e.Regarding.Kind == string(cabundle.MutatingWebhookConfiguration) && e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}
