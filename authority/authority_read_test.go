package authority

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/tlstest"
)

// wedgeableWatches serves Secret watches from the fake's tracker. Once
// wedged, every watch, open or opened later, stays open and delivers
// nothing: a wedged watch cache or a proxy that holds the stream. Until
// then bookmark, when called, sends a bookmark on every open watch, as a
// kube-apiserver does about once a minute.
type wedgeableWatches struct {
	wedged atomic.Bool
	mu     sync.Mutex
	open   []*watch.RaceFreeFakeWatcher
}

func wedgeableSecretWatches(client *fake.Clientset) *wedgeableWatches {
	w := &wedgeableWatches{}
	client.PrependWatchReactor("secrets", func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		tw, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return true, nil, err
		}
		out := watch.NewRaceFreeFake()
		go func() {
			for ev := range tw.ResultChan() {
				if !w.wedged.Load() {
					out.Action(ev.Type, ev.Object)
				}
			}
		}()
		w.mu.Lock()
		w.open = append(w.open, out)
		w.mu.Unlock()
		return true, out, nil
	})
	return w
}

func (w *wedgeableWatches) bookmark() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, o := range w.open {
		if !w.wedged.Load() {
			o.Action(watch.Bookmark, &corev1.Secret{}) // a no-op once stopped
		}
	}
}

// opened counts the watches made so far: a bookmark sent before the first
// one reaches nobody.
func (w *wedgeableWatches) opened() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.open)
}

// waitWatchHolds waits until a's watch of its CA Secret has synced and its
// cache holds the Secret as the API server has it (the same
// resourceVersion): what a replica at rest reads. The informer lists and
// delivers on the real clock while the test steps the fake one: without
// this wait, minutes of fake time can pass before it has listed, and a
// test that counts the GETs of a replica at rest, or wedges the watch to
// make it stale, would measure a watch that has not started yet.
func waitWatchHolds(t *testing.T, a *Authority, client *fake.Clientset) {
	t.Helper()
	waitFor(t, "the Secret's watch to hold the Secret", func() bool {
		stored, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), a.cfg.Namespace, a.cfg.SecretName)
		if err != nil {
			return false
		}
		view := a.store.src.Cache.Load()
		if view == nil || !view.Synced() {
			return false
		}
		obj, ok, err := view.Store.GetByKey(a.cfg.Namespace + "/" + a.cfg.SecretName)
		cached, _ := obj.(*corev1.Secret)
		return err == nil && ok && cached != nil && cached.ResourceVersion == stored.(metav1.Object).GetResourceVersion()
	})
}

// bookmarkDelivered sends a bookmark on every open watch and waits until
// a's Secret watch has delivered something since: the cache is shown
// current at the clock's time.
func bookmarkDelivered(t *testing.T, a *Authority, watches *wedgeableWatches) {
	t.Helper()
	waitFor(t, "a watch to send the bookmark on", func() bool { return watches.opened() > 0 })
	before := a.store.src.Deliveries()
	watches.bookmark()
	waitFor(t, "the bookmark", func() bool { return a.store.src.Deliveries() > before })
}

// signsWith returns a function that reports whether a signs with ca: its
// signing CA is ca, or the leaf it serves through a real TLS handshake on
// 127.0.0.1 chains to ca.
func signsWith(t *testing.T, a *Authority, ca *x509.Certificate, now func() time.Time) func() bool {
	t.Helper()
	addr := tlstest.Server(t, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		_, _, c := a.CurrentParsedCertKeyContent()
		if c == nil {
			return nil, errors.New("no leaf")
		}
		return c, nil
	}})
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return func() bool {
		_, err := tlstest.Handshake(addr, &tls.Config{ServerName: "localhost", RootCAs: pool, Time: now})
		return err == nil || a.Status().Signing.Fingerprint == Fingerprint(ca)
	}
}

// TestStaleWatchCompromisedCAStopsSigning: the CA Secret's watch stays open
// but delivers nothing (wedged) for longer than the cache may be trusted,
// then an operator marks the signing CA compromised. Driven by its Run loop
// on the fake clock only (nothing kicks it), the replica must stop signing
// with that CA within secretReadsMaxAge of the mark: its checks GET the
// Secret once the cache is that old instead of trusting it forever.
func TestStaleWatchCompromisedCAStopsSigning(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client) // resourceVersions: the cache is used as with a real API server
	wedge := wedgeableSecretWatches(client)
	clk := clocktesting.NewFakeClock(testNow)
	w := newOpsWorld(t, "stale-watch-emergency", client, clk)
	w.a.mu.RLock()
	bad := w.a.cas.signing.Cert
	w.a.mu.RUnlock()
	signsWithBad := signsWith(t, w.a, bad, clk.Now)
	require.True(t, signsWithBad())
	maxAge := secretReadsMaxAge(w.a.cfg.CheckInterval)

	waitWatchHolds(t, w.a, client) // wedged once it has delivered the Secret
	wedge.wedged.Store(true)
	for range 5 { // longer than maxAge: the cache is old, and nothing changed
		clk.Step(time.Minute)
		waitBlocked(t, clk)
	}
	w.annotate(CompromisedCAAnnotation, Fingerprint(bad), CompromisedReasonAnnotation, "leaked",
		CompromisedAtAnnotation, clk.Now().UTC().Format(time.RFC3339))
	marked := clk.Now()
	for signsWithBad() {
		require.Less(t, clk.Since(marked), maxAge, "%v after the CA was marked compromised (the Secret's watch delivers nothing), the replica still signs with it; status %+v",
			clk.Since(marked), w.a.Status())
		clk.Step(time.Second)
		waitBlocked(t, clk)
	}
	t.Logf("stopped signing with the compromised CA %v after the mark (bound %v)", clk.Since(marked), maxAge)
	require.NotEqual(t, Fingerprint(bad), w.a.Status().Signing.Fingerprint)
	assert.NoError(t, w.a.LastError())
}

// TestStaleWatchWithFailingGetIsReported: the watch delivers nothing and
// every GET fails. Once nothing was read fresh for secretReadsMaxAge the
// replica must say so: a LastError naming the stale watch and one more
// load error counted, while RotationCheck stays with the schedule. A GET
// that succeeds again clears it all.
func TestStaleWatchWithFailingGetIsReported(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"forbidden", apierrors.NewForbidden(corev1.Resource("secrets"), "ca", errors.New("RBAC: get revoked"))},
		{"unavailable", apierrors.NewServiceUnavailable("proxy: upstream unavailable")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			optimistic(client) // resourceVersions: the cache is used as with a real API server
			wedge := wedgeableSecretWatches(client)
			gets := interceptSecrets(client, "get", nil)
			clk := clocktesting.NewFakeClock(testNow)
			w := newOpsWorld(t, "stale-watch-get-fails-"+tc.name, client, clk)
			check := RotationCheck(w.a)
			require.NoError(t, check.Check(nil))
			before := certmetricstest.LoadErrors(t, w.a.Name())

			// Wedged once it has delivered the Secret: a watch that has not
			// listed yet would list later and show the cache current then.
			waitWatchHolds(t, w.a, client)
			wedge.wedged.Store(true)
			gets.fail(tc.err)
			for range 4 {
				clk.Step(time.Minute)
				waitBlocked(t, clk)
			}
			s := w.a.Status()
			require.ErrorContains(t, s.LastError, "stale watch")
			require.ErrorContains(t, s.LastError, tc.err.Error())
			// A GET that fails, fails on every replica alike (an outage,
			// an RBAC change, a rotated token): readiness stays with the
			// schedule, or the Service would lose every replica at once.
			require.NoError(t, check.Check(nil), "readiness fails on a stale read, on every replica alike")
			// The failed GET may be counted before it is stale (when a GET
			// succeeded after the watch's last delivery), and once stale.
			counted := certmetricstest.LoadErrors(t, w.a.Name()) - before
			assert.GreaterOrEqual(t, counted, 1.0, "the stale read is a load error")
			for range 3 {
				clk.Step(time.Minute)
				waitBlocked(t, clk)
			}
			assert.Equal(t, counted, certmetricstest.LoadErrors(t, w.a.Name())-before, "the stale read is counted once however often it is retried")
			require.NotNil(t, w.a.Leaf(), "the last leaf keeps being served")

			gets.fail(nil)
			waitFor(t, "a GET to succeed again", func() bool {
				clk.Step(time.Second)
				waitBlocked(t, clk)
				return w.a.LastError() == nil
			})
			assert.False(t, w.a.Status().Stalled)
			assert.NoError(t, check.Check(nil))
		})
	}
}

// TestQuietWatchWithBookmarksCostsNoGet: a watch that delivers bookmarks
// (as a kube-apiserver's does, about once a minute) keeps the cache in use:
// at rest, the checks send no GET, however long it lasts. The same watch
// without bookmarks costs one GET per secretReadsMaxAge.
func TestQuietWatchWithBookmarksCostsNoGet(t *testing.T) {
	for _, bookmarks := range []bool{true, false} {
		t.Run(map[bool]string{true: "bookmarks", false: "none"}[bookmarks], func(t *testing.T) {
			client := fake.NewClientset()
			optimistic(client)
			watches := wedgeableSecretWatches(client)
			gets := interceptSecrets(client, "get", nil)
			clk := clocktesting.NewFakeClock(testNow)
			w := newOpsWorld(t, "quiet-watch-"+map[bool]string{true: "bookmarks", false: "none"}[bookmarks], client, clk)
			// At rest: the watch holds what the replica wrote.
			waitWatchHolds(t, w.a, client)
			const minutes = 30
			start := gets.n.Load()
			for range minutes {
				if bookmarks {
					bookmarkDelivered(t, w.a, watches)
				}
				clk.Step(time.Minute)
				waitBlocked(t, clk)
			}
			n := gets.n.Load() - start
			t.Logf("%d Secret GETs in %d minutes at rest", n, minutes)
			if bookmarks {
				assert.Zero(t, n)
			} else {
				maxAge := secretReadsMaxAge(w.a.cfg.CheckInterval)
				assert.LessOrEqual(t, n, int64(minutes*time.Minute/maxAge)+1)
				assert.Positive(t, n)
			}
			require.NoError(t, w.a.LastError())
		})
	}
}

// TestSecretCertKeyResyncRereadsWedgedWatch: the watch of a --tls-secret
// stays open but delivers nothing, and the Secret is replaced in the API
// (cert-manager renewed it). Within Resync on the provider's clock the new
// certificate must be served (a real handshake), because Resync re-reads
// the Secret; a failed re-read is reported and retried with backoff.
func TestSecretCertKeyResyncRereadsWedgedWatch(t *testing.T) {
	first := issueTestPair(t, "localhost", testNow, time.Hour)
	second := issueTestPair(t, "localhost", testNow, time.Hour)
	client := fake.NewClientset(tlsSecret("s", map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM}))
	wedge := wedgeableSecretWatches(client)
	gets := interceptSecrets(client, "get", nil)
	clk := clocktesting.NewFakeClock(testNow)
	const resync = 10 * time.Minute
	p, err := dynamiccert.NewSecretCertKey(dynamiccert.SecretConfig{Name: "secret-resync-wedged", Namespace: "ns", SecretName: "s", Client: client, Clock: clk, Resync: resync})
	require.NoError(t, err)
	runInBackground(t, p.Run)
	addr := tlstest.Server(t, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		_, _, c := p.CurrentParsedCertKeyContent()
		if c == nil {
			return nil, errors.New("no certificate yet")
		}
		return c, nil
	}})
	served := func() *x509.Certificate {
		t.Helper()
		c, err := tlstest.Handshake(addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test compares what is served
		require.NoError(t, err)
		return c
	}
	waitFor(t, "the first certificate", func() bool { c, _ := p.CurrentCertKeyContent(); return c != nil })
	require.True(t, served().Equal(first.Cert))
	waitFor(t, "the provider to wait on its clock for the Secret's re-read (Resync)", clk.HasWaiters)

	wedge.wedged.Store(true)
	_, err = client.CoreV1().Secrets("ns").Update(context.Background(), tlsSecret("s", map[string][]byte{"tls.crt": second.CertPEM, "tls.key": second.KeyPEM}), metav1.UpdateOptions{})
	require.NoError(t, err)
	clk.Step(resync - time.Second)
	waitBlocked(t, clk)
	require.True(t, served().Equal(first.Cert), "the watch delivers nothing: the old certificate until Resync")

	// The re-read fails first: reported, and retried with backoff, not
	// after another Resync.
	gets.fail(apierrors.NewServiceUnavailable("proxy: upstream unavailable"))
	before := gets.n.Load()
	clk.Step(time.Second)
	waitFor(t, "the re-read at Resync", func() bool { return gets.n.Load() > before })
	waitFor(t, "the failed re-read reported", func() bool { return p.LastError() != nil })
	require.ErrorContains(t, p.LastError(), "re-reading secret ns/s")
	waitBlocked(t, clk)
	gets.fail(nil)
	clk.Step(2 * time.Second) // past the first backoff delay (at most 1.2 s)
	waitFor(t, "the replaced certificate served after Resync with the watch wedged", func() bool { return served().Equal(second.Cert) })
	require.NoError(t, p.LastError())
}

// TestGetForbiddenWatchAllowed: RBAC forbids get on the CA Secret but allows
// list and watch. Whether the first check's GET fails before the watch has
// listed (get-first: the list fails until then, as it does when the API
// server is slow to answer it) or in whichever order Run makes them, the
// replica must end up serving from the watch, with no error and no GET at
// rest (a kube-apiserver's watch sends bookmarks). A GET that failed once
// kept every later check on GETs, so the same deployment worked or never
// worked depending on that order (issue 27 §4).
func TestGetForbiddenWatchAllowed(t *testing.T) {
	for _, getFirst := range []bool{true, false} {
		name := map[bool]string{true: "get-first", false: "any-order"}[getFirst]
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset()
			optimistic(client)
			watches := wedgeableSecretWatches(client)
			var got atomic.Bool
			gets := interceptSecrets(client, "get", forbidden())
			client.PrependReactor("get", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
				got.Store(true)
				return false, nil, nil
			})
			if getFirst {
				// The fake client runs one reactor at a time: fail the
				// list rather than block it.
				client.PrependReactor("list", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
					if !got.Load() {
						return true, nil, apierrors.NewServiceUnavailable("not yet")
					}
					return false, nil, nil
				})
			}
			clk := clocktesting.NewFakeClock(testNow)
			a := newTestAuthority(t, client, clk, "get-forbidden-"+name)

			runInBackground(t, a.Run)
			waitFor(t, "the replica to serve", func() bool {
				clk.Step(time.Second)
				waitBlocked(t, clk)
				return a.Leaf() != nil
			})
			// Until the watch delivers the replica's own write, a check
			// may still GET (secretReads.awaiting): rest starts after.
			var atRest int64
			for i := range 20 {
				if i == 2 {
					atRest = gets.n.Load()
				}
				bookmarkDelivered(t, a, watches)
				clk.Step(30 * time.Second)
				waitBlocked(t, clk)
			}
			assert.NoError(t, a.LastError())
			assert.Equal(t, atRest, gets.n.Load(), "GETs at rest, while the watch delivers")
			require.NotNil(t, a.Leaf())
		})
	}
}

// TestWatchListFailsOnceThenSecretAbsent: RBAC forbids get on the CA Secret,
// the Secret does not exist yet, and the watch's first list fails (an API
// server that is still starting answers 503). The reflector lists again
// and succeeds: no Secret, as the cache holds. The replica must create the
// Secret from the watch's cache and serve. The failed list had marked the
// watch failing, and only a watch event cleared that: with the Secret
// absent from the list and the cache no event comes, so every check kept
// sending a GET that RBAC forbids and the replica never served.
func TestWatchListFailsOnceThenSecretAbsent(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	gets := interceptSecrets(client, "get", forbidden())
	var lists atomic.Int32
	client.PrependReactor("list", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		if lists.Add(1) == 1 {
			return true, nil, apierrors.NewServiceUnavailable("the API server is starting")
		}
		return false, nil, nil
	})
	clk := clocktesting.NewFakeClock(testNow)
	a := newTestAuthority(t, client, clk, "list-fails-once")

	runInBackground(t, a.Run)
	// The reflector retries the list on the real clock (about a second).
	waitFor(t, "the watch to list again", func() bool { return lists.Load() >= 2 })
	waitFor(t, "the replica to serve", func() bool {
		clk.Step(time.Second)
		waitBlocked(t, clk)
		return a.Leaf() != nil
	})
	_, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), "ns", "ca")
	require.NoError(t, err, "the replica created the Secret")
	t.Logf("%d forbidden GETs", gets.n.Load())
}
