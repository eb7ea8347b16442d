package cabundle

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeStart is the fake clocks' start: any fixed time will do.
var fakeStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// TestCompetingWriterIsContestedAndConverges runs the real Run loop on a
// fake clock against a fake clientset, next to a writer that puts its own
// caBundle back every time it changes (Helm, cainjector). Over 30
// simulated minutes the publisher must write a handful of times, bounded by
// the contested backoff, instead of once per flip; report the object as
// contested (metric, health, Event); and, once the other writer stops,
// converge: its bundle stays and the contest clears.
func TestCompetingWriterIsContestedAndConverges(t *testing.T) {
	ctx := context.Background()
	ours, theirs := newBundle(t, "ours"), newBundle(t, "theirs")
	const name = "contested"
	key := objectKey(MutatingWebhookConfiguration, name)
	f := fakeClients{kube: kubefake.NewClientset()}
	mwcs := f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := mwcs.Create(ctx, mutatingWithBundle(name, theirs), metav1.CreateOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(fakeStart)
	rec := &testRecorder{}
	cfg := f.config(newTestCA(ours), false, Target{Kind: MutatingWebhookConfiguration, Name: name})
	cfg.Clock, cfg.EventRecorder = clk, rec
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	before := publishCounts(t, MutatingWebhookConfiguration)

	other := startCompetitor(t, f.kube, name, theirs, "helm")
	runPublisher(t, p)
	writes := func() int { return len(f.patches()) }
	actions := func() int { return len(f.kube.Actions()) }

	// Pre-contest writes: the first one, then one per change back until
	// the contestReverts-th makes the object contested; one more may
	// slip through while the event that completes the count is on its way.
	const fight = 30 * time.Minute
	bound := contestReverts + 2 + maxContestedWrites(fight)
	for clk.Since(fakeStart) < fight {
		clk.Step(2 * time.Second)
		settle(actions)
		if n := writes(); n > bound {
			t.Fatalf("%d writes after %v simulated next to a competing writer, want <= %d (one per backoff delay, not one per flip)",
				n, clk.Since(fakeStart), bound)
		}
	}
	fightWrites := writes()
	t.Logf("%d writes in %v simulated next to a competing writer (bound %d); it rewrote %d times", fightWrites, fight, bound, other.rewrites.Load())
	if fightWrites < contestReverts+1 {
		t.Errorf("%d writes: the publisher did not write the bundle back before backing off", fightWrites)
	}
	if d := countsDelta(before, publishCounts(t, MutatingWebhookConfiguration)); d[resultContested] < 1 {
		t.Errorf("metrics delta %v, want result=contested > 0", d)
	}
	err = p.HealthCheck().Check(nil)
	if err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "contested") || !strings.Contains(err.Error(), "helm") {
		t.Errorf("health check while contested: %v, want a failure naming %s, contested and helm", err, key)
	}
	if got := p.Contested(); !reflect.DeepEqual(got, []string{key}) {
		t.Errorf("Contested() = %v, want [%s]", got, key)
	}
	if ev := rec.await(t, reasonContested); len(ev) != 1 || ev[0].eventtype != "Warning" || ev[0].name != name ||
		ev[0].kind != string(MutatingWebhookConfiguration) || !strings.Contains(ev[0].note, "helm") {
		t.Errorf("contested events %+v, want one Warning on the object naming helm", ev)
	}

	// The other writer stops: the next write sticks, the contest clears.
	other.stop()
	const convergeWithin = 20 * time.Minute // cap*1.5 until the next write, as long again to clear
	stopped := clk.Now()
	converged := func() bool {
		o, err := mwcs.Get(ctx, name, metav1.GetOptions{})
		return err == nil && bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, ours) &&
			p.HealthCheck().Check(nil) == nil && len(p.Contested()) == 0
	}
	for !converged() {
		if clk.Since(stopped) > convergeWithin {
			t.Fatalf("not converged %v (simulated) after the other writer stopped; health: %v", convergeWithin, p.HealthCheck().Check(nil))
		}
		clk.Step(2 * time.Second)
		settle(actions)
	}
	t.Logf("converged %v (simulated) after the other writer stopped, with %d more writes", clk.Since(stopped), writes()-fightWrites)
	if ev := rec.await(t, reasonUncontested); len(ev) != 1 || ev[0].eventtype != "Normal" {
		t.Errorf("uncontested events %+v, want one Normal", ev)
	}
	// And it stays so, with no more writes.
	settled := writes()
	for range 600 {
		clk.Step(time.Second)
	}
	settle(actions)
	if o, err := mwcs.Get(ctx, name, metav1.GetOptions{}); err != nil || !bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, ours) || writes() != settled {
		t.Errorf("after converging: %d more writes, err %v", writes()-settled, err)
	}
}

// TestServerSideApplyDoesNotForceSilently checks the force policy: a
// caBundle that another field manager owns is a conflict, reported as
// contested, and taken over with a forced apply only after the backoff,
// with a log line and an Event.
func TestServerSideApplyDoesNotForceSilently(t *testing.T) {
	ctx := context.Background()
	ours, theirs := newBundle(t, "ours"), newBundle(t, "theirs")
	const name = "ssa-owned"
	key := objectKey(MutatingWebhookConfiguration, name)
	f := fakeClients{kube: kubefake.NewClientset()}
	mwcs := f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := mwcs.Create(ctx, mutatingWithBundle(name, theirs), metav1.CreateOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(fakeStart)
	rec := &testRecorder{}
	cfg := f.config(newTestCA(ours), true, Target{Kind: MutatingWebhookConfiguration, Name: name})
	cfg.Clock, cfg.EventRecorder = clk, rec
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	before := publishCounts(t, MutatingWebhookConfiguration)
	runPublisher(t, p)
	forced := func() (n int) {
		for _, a := range f.patches() {
			if o := a.(clienttesting.PatchActionImpl).PatchOptions; o.Force != nil && *o.Force {
				n++
			}
		}
		return n
	}
	bundleNow := func() []byte {
		o, err := mwcs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return o.Webhooks[0].ClientConfig.CABundle
	}

	eventually(t, 10*time.Second, "the conflict reported as contested", func() bool {
		return countsDelta(before, publishCounts(t, MutatingWebhookConfiguration))[resultContested] >= 1
	})
	if n := forced(); n != 0 {
		t.Errorf("%d forced applies before the backoff", n)
	}
	if !bytes.Equal(bundleNow(), theirs) {
		t.Error("the other manager's caBundle was taken over before the backoff")
	}
	if err := p.HealthCheck().Check(nil); err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "helm") {
		t.Errorf("health check: %v, want a failure naming %s and helm", err, key)
	}
	// The Event is sent right after the contested write is counted: wait
	// for it rather than race it.
	eventually(t, 10*time.Second, "the contested Event", func() bool { return len(rec.find(reasonContested)) >= 1 })
	if ev := rec.find(reasonContested); len(ev) != 1 || !strings.Contains(ev[0].note, "helm") || !strings.Contains(ev[0].note, "not forcing") {
		t.Errorf("contested events %+v, want one naming helm and saying it does not force", ev)
	}
	if len(f.patches()) == 0 || f.patches()[0].GetPatchType() != "application/apply-patch+yaml" {
		t.Errorf("first write %v, want an apply", f.patches())
	}

	// After the backoff: one forced apply, announced.
	for !bytes.Equal(bundleNow(), ours) {
		if clk.Since(fakeStart) > 2*contestInitialDelay {
			t.Fatalf("not forced %v (simulated) after the conflict", clk.Since(fakeStart))
		}
		clk.Step(time.Second)
		settle(func() int { return len(f.kube.Actions()) })
	}
	if n := forced(); n != 1 {
		t.Errorf("%d forced applies, want 1", n)
	}
	if ev := rec.find(reasonForced); len(ev) != 1 || ev[0].eventtype != "Warning" || !strings.Contains(ev[0].note, "helm") {
		t.Errorf("forced events %+v, want one Warning naming helm", ev)
	}
	// It stuck: the contest clears.
	for p.HealthCheck().Check(nil) != nil {
		if clk.Since(fakeStart) > 2*contestInitialDelay+2*contestQuiet {
			t.Fatalf("still contested %v (simulated) after the forced apply: %v", clk.Since(fakeStart), p.HealthCheck().Check(nil))
		}
		clk.Step(time.Second)
		settle(func() int { return len(f.kube.Actions()) })
	}
	if len(rec.await(t, reasonUncontested)) != 1 {
		t.Errorf("no uncontested event: %+v", rec.events)
	}
}

// TestServerSideApplyTakesOverOwnUpdateAtOnce: a caBundle last written by
// the publisher's own JSON patch (an Update under the same field manager
// name) is no contest; switching to server-side apply takes it at once.
func TestServerSideApplyTakesOverOwnUpdateAtOnce(t *testing.T) {
	ctx := context.Background()
	const name = "switch-to-ssa"
	f := fakeClients{kube: kubefake.NewClientset()}
	mwcs := f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := mwcs.Create(ctx, mutatingWithBundle(name, nil), metav1.CreateOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	for _, ssa := range []bool{false, true} {
		patchesBefore := len(f.patches())
		bundle := newBundle(t, "ca")
		cfg := f.config(newTestCA(bundle), ssa, Target{Kind: MutatingWebhookConfiguration, Name: name})
		cfg.Clock = clocktesting.NewFakeClock(fakeStart)
		p, err := NewPublisher(cfg)
		if err != nil {
			t.Fatal(err)
		}
		stop := runPublisher(t, p)
		waitReady(t, p, 10*time.Second)
		stop()
		if got := p.Contested(); len(got) != 0 {
			t.Errorf("ssa=%v: contested %v", ssa, got)
		}

		o, _ := mwcs.Get(ctx, name, metav1.GetOptions{})
		if !bytes.Equal(o.Webhooks[0].ClientConfig.CABundle, bundle) {
			t.Errorf("ssa=%v: not published", ssa)
		}
		if !ssa {
			continue
		}
		// Without force first; the conflict names only our own manager,
		// so the forced apply follows at once.
		var force []bool
		for _, a := range f.patches()[patchesBefore:] {
			fo := a.(clienttesting.PatchActionImpl).PatchOptions.Force
			force = append(force, fo != nil && *fo)
		}
		// (A stale cache, without resourceVersions in the fake, may cause
		// one more apply, which then owns the field and needs no force.)
		if len(force) < 2 || force[0] || !force[1] || slices.Contains(force[2:], true) {
			t.Errorf("applies forced %v, want [false true] and no more forcing", force)
		}
	}
}

func TestConflictManagers(t *testing.T) {
	gr := schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations"}
	err := apierrors.NewApplyConflict([]metav1.StatusCause{
		{Type: metav1.CauseTypeFieldManagerConflict, Message: `conflict with "helm" using admissionregistration.k8s.io/v1 at 2030-01-01T00:00:00Z`, Field: ".webhooks[name=\"w\"].clientConfig.caBundle"},
		{Type: metav1.CauseTypeFieldManagerConflict, Message: `conflict with "evercert" using admissionregistration.k8s.io/v1`},
		{Type: metav1.CauseTypeFieldManagerConflict, Message: `conflict with "a \"quoted\" one"`},
		{Type: metav1.CauseTypeFieldManagerConflict, Message: `conflict with "helm"`},
	}, "Apply failed with 3 conflicts")
	if !isApplyConflict(err) {
		t.Error("apply conflict not recognised")
	}
	if got, want := conflictManagers(err, "evercert"), []string{`a "quoted" one`, "helm"}; !reflect.DeepEqual(got, want) {
		t.Errorf("managers %q, want %q", got, want)
	}
	if isApplyConflict(apierrors.NewConflict(gr, "x", errors.New("the object has been modified"))) {
		t.Error("an optimistic-concurrency conflict taken for an apply conflict")
	}
}

func TestChangedAway(t *testing.T) {
	b := []byte("B")
	s := func(webhook, v string) slot { return slot{webhook: webhook, current: []byte(v)} }
	for _, tc := range []struct {
		name     string
		old, cur []slot
		want     bool
	}{
		{"overwritten", []slot{s("a", "B")}, []slot{s("a", "X")}, true},
		{"removed", []slot{s("a", "B")}, []slot{s("a", "")}, true},
		{"repaired", []slot{s("a", "X")}, []slot{s("a", "B")}, false},
		{"other webhook added without bundle", []slot{s("a", "B")}, []slot{s("a", "B"), s("b", "")}, false},
		{"webhook removed", []slot{s("a", "B"), s("b", "B")}, []slot{s("b", "B")}, false},
		{"reordered", []slot{s("a", "B"), s("b", "X")}, []slot{s("b", "X"), s("a", "B")}, false},
	} {
		if got := len(changesAway(tc.old, tc.cur, b)) > 0; got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
