package cabundle

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestRunOnSteppingFakeClock runs the real Run loop on a fake clock with a
// fake clientset, as the fault soak does: the first publish needs no clock
// step; a failed write is retried only when the clock is stepped past the
// backoff, and a 429 waits at least its Retry-After; the resync ticker runs
// on the same clock.
func TestRunOnSteppingFakeClock(t *testing.T) {
	ctx := context.Background()
	const name = "clocked"
	f := fakeClients{kube: kubefake.NewClientset(mutatingWithBundle(name, nil))}
	mwcs := f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	var attempts atomic.Int64 // write attempts
	var failures atomic.Value // []error still to return, in order
	failures.Store([]error{})
	f.kube.PrependReactor("patch", "mutatingwebhookconfigurations", func(clienttesting.Action) (bool, k8sruntime.Object, error) {
		attempts.Add(1)
		fs := failures.Load().([]error)
		if len(fs) == 0 {
			return false, nil, nil
		}
		failures.Store(fs[1:])
		return true, nil, fs[0]
	})
	clk := clocktesting.NewFakeClock(fakeStart)
	source := newTestCA(newBundle(t, "first"))
	cfg := f.config(source, false, Target{Kind: MutatingWebhookConfiguration, Name: name})
	cfg.Clock = clk
	// Far from the steps below, so that no tick retries in their stead.
	cfg.Resync = time.Hour
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	actions := func() int { return len(f.kube.Actions()) }
	holds := func(b []byte) bool {
		o, err := mwcs.Get(ctx, name, metav1.GetOptions{})
		return err == nil && bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, b)
	}

	// Published without any step of the clock.
	waitReady(t, p, 10*time.Second)

	// Failed writes are retried after the backoff, on the fake clock.
	// Events of the publisher's own earlier write may still cause a sync
	// or two (they bypass the backoff) and consume failures; with four,
	// at least one retry must come from the clock, and no event is left
	// to cause one (a failed write changes nothing).
	internal := apierrors.NewInternalError(errors.New("etcd is sad"))
	failures.Store([]error{internal, internal, internal, internal})
	second := newBundle(t, "second")
	source.set(second)
	eventually(t, 10*time.Second, "the first attempt", func() bool { return attempts.Load() >= 1 })
	settle(actions)
	if holds(second) {
		t.Fatal("published through four failures without a clock step")
	}
	for !holds(second) {
		if clk.Since(fakeStart) > time.Minute {
			t.Fatal("not retried within a simulated minute")
		}
		clk.Step(time.Second)
		settle(actions)
	}

	// A 429 asks for 60s: a retry waits at least that long.
	tooMany := apierrors.NewTooManyRequests("slow down", 60)
	failures.Store([]error{tooMany, tooMany, tooMany})
	third := newBundle(t, "third")
	source.set(third)
	eventually(t, 10*time.Second, "the first attempt", func() bool { return len(failures.Load().([]error)) < 3 })
	settle(actions)
	asked := clk.Now()
	clk.Step(30 * time.Second)
	settle(actions)
	if holds(third) {
		t.Fatal("retried 30s (simulated) into a 60s Retry-After")
	}
	unchanged := publishCounts(t, MutatingWebhookConfiguration)[resultUnchanged]
	for !holds(third) {
		if clk.Since(asked) > 5*time.Minute {
			t.Fatal("not retried within 5 simulated minutes")
		}
		clk.Step(31 * time.Second)
		settle(actions)
	}
	// The watch event of that write causes one more sync, which finds the
	// object up to date; after it, nothing is pending.
	eventually(t, 10*time.Second, "the sync after the write", func() bool {
		return publishCounts(t, MutatingWebhookConfiguration)[resultUnchanged] > unchanged
	})

	// The resync ticker is on the same clock: a bundle change that nobody
	// is told about is published at the next tick.
	fourth := newBundle(t, "fourth")
	source.mu.Lock()
	source.bundle = fourth
	source.mu.Unlock()
	settle(actions)
	if holds(fourth) {
		t.Fatal("published without a notification or a resync")
	}
	clk.Step(time.Hour)
	eventually(t, 10*time.Second, "published at the resync", func() bool { return holds(fourth) })
}
