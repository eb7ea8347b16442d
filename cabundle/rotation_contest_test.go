package cabundle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// replicaSet is a set of publishers (the replicas of one Deployment, same
// field manager) on one fake clock, each with its own source, writing one
// object (a MutatingWebhookConfiguration or a ClusterTrustBundle) through
// a fake clientset that enforces resourceVersions, each running its real
// Run loop.
type replicaSet struct {
	f       fakeClients
	clk     *clocktesting.FakeClock
	rec     *testRecorder // every replica's Events
	ps      []*Publisher
	sources []*testCA
	// read returns what the object's (first) field holds; nil while the
	// object is missing.
	read func() ([]byte, error)
}

// startReplicas starts replicas of a publisher to the named
// MutatingWebhookConfiguration, created by "helm" without a caBundle; one
// replica for each initial bundle, which its source starts with.
func startReplicas(t *testing.T, name string, initial ...[]byte) *replicaSet {
	t.Helper()
	return startReplicasWith(t, Target{Kind: MutatingWebhookConfiguration, Name: name}, nil, initial...)
}

// startReplicasWith is startReplicas to target (a MutatingWebhookConfiguration,
// created by the test, or a ClusterTrustBundle, which the replicas create)
// with configure, when not nil, called on each replica's configuration (by
// index) before it starts.
func startReplicasWith(t *testing.T, target Target, configure func(i int, cfg *PublisherConfig), initial ...[]byte) *replicaSet {
	t.Helper()
	r := &replicaSet{f: fakeClients{kube: kubefake.NewClientset()}, clk: clocktesting.NewFakeClock(fakeStart), rec: &testRecorder{}}
	switch target.Kind {
	case MutatingWebhookConfiguration:
		enforceResourceVersions(t, r.f.kube, "mutatingwebhookconfigurations",
			func() k8sruntime.Object { return &admissionregistrationv1.MutatingWebhookConfiguration{} })
		mwcs := r.f.kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
		if _, err := mwcs.Create(context.Background(), mutatingWithBundle(target.Name, nil), metav1.CreateOptions{FieldManager: "helm"}); err != nil {
			t.Fatal(err)
		}
		r.read = func() ([]byte, error) {
			o, err := mwcs.Get(context.Background(), target.Name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return o.Webhooks[0].ClientConfig.CABundle, nil
		}
	case ClusterTrustBundle:
		enforceResourceVersions(t, r.f.kube, "clustertrustbundles",
			func() k8sruntime.Object { return &certificatesv1.ClusterTrustBundle{} })
		ctbs := r.f.kube.CertificatesV1().ClusterTrustBundles()
		r.read = func() ([]byte, error) {
			o, err := ctbs.Get(context.Background(), target.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			return []byte(o.Spec.TrustBundle), nil
		}
	default:
		t.Fatalf("no replica set for kind %s", target.Kind)
	}
	for _, b := range initial {
		source := newTestCA(b)
		cfg := r.f.config(source, false, target)
		cfg.Clock, cfg.EventRecorder = r.clk, r.rec
		if configure != nil {
			configure(len(r.ps), &cfg)
		}
		p, err := NewPublisher(cfg)
		if err != nil {
			t.Fatal(err)
		}
		runPublisher(t, p)
		r.ps = append(r.ps, p)
		r.sources = append(r.sources, source)
	}
	return r
}

func (r *replicaSet) settle() { settle(func() int { return len(r.f.kube.Actions()) }) }

// holds reports whether the object's field holds b.
func (r *replicaSet) holds(t *testing.T, b []byte) bool {
	t.Helper()
	got, err := r.read()
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(got, b)
}

// caAt returns the PEM of a fresh CA issued at now.
func caAt(t *testing.T, name string, now time.Time) []byte {
	t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: name, Now: now, Lifetime: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return ca.CertPEM
}

func concat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// TestReplicasRotatingTogetherAreNotContested runs three replicas of one
// publisher through a CA rotation ([A] -> [A B] -> [B]), each replica's
// source seeing every step one (simulated) second after the previous
// replica's, as replicas reading one Secret do. Before, every replica
// counted the others' writes of the newer step as "changed away by another
// writer" and the replicas behind wrote their older bundle back: one step
// made two replicas contested (Warning Event, health failing, writes held
// back) for 30 s. Now no replica counts a change away or is contested, and
// the object ends holding [B] after a handful of writes, not a fight.
//
// The ClusterTrustBundle case (the replicas create the bundle) failed
// until managedFields entries owning spec.trustBundle counted as owning
// the bundle field: before, a ClusterTrustBundle had no owner, so no
// write was ever taken for a replica's.
func TestReplicasRotatingTogetherAreNotContested(t *testing.T) {
	const signer = "evercert.io/serving"
	for _, target := range []Target{
		{Kind: MutatingWebhookConfiguration, Name: "rotating"},
		{Kind: ClusterTrustBundle, Name: ClusterTrustBundleName(signer, "rotating"), SignerName: signer},
	} {
		t.Run(string(target.Kind), func(t *testing.T) { testReplicasRotatingTogether(t, target) })
	}
}

func testReplicasRotatingTogether(t *testing.T, target Target) {
	key := objectKey(target.Kind, target.Name)
	a := caAt(t, "a", fakeStart.Add(-24*time.Hour))
	b := caAt(t, "b", fakeStart)
	steps := [][]byte{concat(a, b), b}
	r := startReplicasWith(t, target, nil, a, a, a)
	for !r.holds(t, a) {
		r.settle()
	}
	// Replicas that lost the race to create the object are ready once
	// their informers have it.
	for i, p := range r.ps {
		for j := 0; !p.HasSynced(); j++ {
			if j == 100 {
				t.Fatalf("replica %d never ready", i)
			}
			r.clk.Step(time.Second)
			r.settle()
		}
	}
	writesBefore := len(r.f.patches())
	before := publishCounts(t, target.Kind)
	check := func(when string) {
		t.Helper()
		for i, p := range r.ps {
			if c := p.Contested(); len(c) > 0 {
				t.Fatalf("%s: replica %d reports %v contested", when, i, c)
			}
			if err := p.HealthCheck().Check(nil); err != nil {
				t.Fatalf("%s: replica %d health: %v", when, i, err)
			}
			if g := p.contests.gate(key); g.reverts > 0 {
				t.Fatalf("%s: replica %d counted %d changes away by another writer", when, i, g.reverts)
			}
		}
	}
	for si, bundle := range steps {
		for i, source := range r.sources {
			source.set(bundle)
			r.settle()
			r.clk.Step(time.Second)
			r.settle()
			check(fmt.Sprintf("step %d, replica %d caught up", si+1, i))
		}
	}
	for range 60 {
		r.clk.Step(time.Second)
		r.settle()
		check("after the rotation")
	}
	if !r.holds(t, b) {
		t.Fatal("the object does not hold the last step of the rotation")
	}
	// One write per step is the ideal; the replicas race for it, and the
	// losers' conflicts are retried on a newer cache that holds the bundle.
	if n := len(r.f.patches()) - writesBefore; n > 2*len(steps) {
		t.Errorf("%d writes for a %d-step rotation by %d replicas, want at most %d", n, len(steps), len(r.ps), 2*len(steps))
	}
	if ev := r.rec.find(reasonContested); len(ev) > 0 {
		t.Errorf("contested Events %+v, want none", ev)
	}
	d := countsDelta(before, publishCounts(t, target.Kind))
	if d[resultContested] > 0 {
		t.Errorf("metrics delta %v, want no result=contested", d)
	}
	if d[resultReplicaAhead] < 1 {
		t.Errorf("metrics delta %v, want the writes held back for the replica ahead counted as result=replica_ahead", d)
	}
}

// TestReplicaStuckBehindIsContested: a replica whose source stays a step
// behind (its Secret watch is broken) must not hold the newer bundle of the
// others back forever, nor fight them at API latency, nor be hidden: it
// waits replicaGrace (on the publisher's clock), then writes; the replica
// ahead repairs that as drift, and with the stuck one persisting the object
// becomes contested there, backs off, and names our own field manager.
func TestReplicaStuckBehindIsContested(t *testing.T) {
	const name = "stuck"
	key := objectKey(MutatingWebhookConfiguration, name)
	a := caAt(t, "a", fakeStart.Add(-24*time.Hour))
	b := caAt(t, "b", fakeStart)
	r := startReplicas(t, name, a, a)
	for !r.holds(t, a) {
		r.settle()
	}
	r.sources[0].set(concat(a, b))
	for !r.holds(t, concat(a, b)) {
		r.settle()
	}
	before := len(r.f.patches())
	// Within the grace the replica behind leaves the newer bundle alone.
	start := r.clk.Now()
	for r.clk.Since(start) < replicaGrace-time.Second {
		r.clk.Step(time.Second)
		r.settle()
		if !r.holds(t, concat(a, b)) {
			t.Fatalf("the replica behind wrote its older bundle %v into the grace", r.clk.Since(start))
		}
	}
	// Then it writes, and the two are a contest with a bounded number of
	// writes, not a fight at API latency.
	const fight = 10 * time.Minute
	for r.clk.Since(start) < fight {
		r.clk.Step(2 * time.Second)
		r.settle()
	}
	n := len(r.f.patches()) - before
	if n < 1 {
		t.Error("the replica stuck behind never wrote its bundle")
	}
	if bound := 2 * (contestReverts + 2 + maxContestedWrites(fight)); n > bound {
		t.Errorf("%d writes in %v by two replicas a rotation step apart, want <= %d", n, fight, bound)
	}
	if got := r.ps[0].Contested(); !slices.Equal(got, []string{key}) {
		t.Errorf("replica ahead: Contested() = %v after %v a step apart from a stuck replica, want [%s]", got, fight, key)
	}
	if err := r.ps[0].HealthCheck().Check(nil); err == nil || !strings.Contains(err.Error(), DefaultFieldManager+" (another replica") {
		t.Errorf("replica ahead: health %v, want a failure naming our own field manager", err)
	}
	if ev := r.rec.await(t, reasonContested); len(ev) == 0 {
		t.Error("no contested Event")
	}
}

// TestSameFieldManagerOtherCAIsContested: two publishers with the default
// field manager but unrelated CAs (two installations pointed at one
// webhook) are not replicas of one rotation: their fight is contested.
func TestSameFieldManagerOtherCAIsContested(t *testing.T) {
	const name = "two-cas"
	r := startReplicas(t, name, caAt(t, "one", fakeStart), caAt(t, "other", fakeStart))
	const fight = 5 * time.Minute
	for r.clk.Since(fakeStart) < fight {
		r.clk.Step(2 * time.Second)
		r.settle()
	}
	if len(r.ps[0].Contested())+len(r.ps[1].Contested()) == 0 {
		t.Error("two publishers of unrelated CAs under one field manager: neither reports the object contested")
	}
	if n, bound := len(r.f.patches()), 2*(contestReverts+2+maxContestedWrites(fight)); n > bound {
		t.Errorf("%d writes in %v, want <= %d", n, fight, bound)
	}
}

// TestOtherWriterAheadInRotationIsContested: another field manager writing
// a bundle that is a later step of our rotation (our CA plus a newer one)
// is another writer all the same: only our own field manager is excused.
func TestOtherWriterAheadInRotationIsContested(t *testing.T) {
	const name = "rival-ahead"
	key := objectKey(MutatingWebhookConfiguration, name)
	a := caAt(t, "a", fakeStart.Add(-24*time.Hour))
	theirs := concat(a, caAt(t, "b", fakeStart))
	r := startReplicas(t, name, a)
	for !r.holds(t, a) {
		r.settle()
	}
	startCompetitor(t, r.f.kube, name, theirs, "rival")
	const fight = 5 * time.Minute
	for r.clk.Since(fakeStart) < fight && len(r.ps[0].Contested()) == 0 {
		r.clk.Step(2 * time.Second)
		r.settle()
	}
	if got := r.ps[0].Contested(); !slices.Equal(got, []string{key}) {
		t.Fatalf("Contested() = %v next to another field manager writing a later step of our rotation, want [%s]", got, key)
	}
	if ev := r.rec.await(t, reasonContested); len(ev) != 1 || !strings.Contains(ev[0].note, "rival") {
		t.Errorf("contested Events %+v, want one naming rival", ev)
	}
}

// TestAheadInRotation pins which bundles count as a later step of ours.
func TestAheadInRotation(t *testing.T) {
	a := caAt(t, "a", fakeStart.Add(-48*time.Hour))
	b := caAt(t, "b", fakeStart.Add(-24*time.Hour))
	c := caAt(t, "c", fakeStart)
	x := caAt(t, "x", fakeStart) // unrelated, newer than everything
	old := caAt(t, "old", fakeStart.Add(-72*time.Hour))
	for _, tc := range []struct {
		name   string
		values [][]byte
		ours   []byte
		want   bool
	}{
		{"successor joined", [][]byte{concat(a, b)}, a, true},
		{"old CA dropped", [][]byte{b}, concat(a, b), true},
		{"two steps ahead", [][]byte{concat(b, c)}, concat(a, b), true},
		{"successor joined after a dropped one", [][]byte{concat(b, c)}, b, true},
		{"one slot ahead, one not", [][]byte{concat(a, b), a}, a, false},
		{"behind: successor not joined yet", [][]byte{a}, concat(a, b), false},
		{"behind: old CA still there", [][]byte{concat(a, b)}, b, false},
		{"unrelated newer CA", [][]byte{x}, a, false},
		{"unrelated newer CA after ours dropped", [][]byte{c}, concat(a, b), false},
		{"the same CAs reordered", [][]byte{concat(b, a)}, concat(a, b), false},
		{"the newer CA swapped for another", [][]byte{concat(a, c)}, concat(a, b), false},
		{"a newer CA dropped, an older kept", [][]byte{concat(a, c)}, concat(a, b, c), false},
		{"rolled back to the old CA", [][]byte{a}, concat(a, b), false},
		{"an older unrelated CA joined with a successor", [][]byte{concat(old, b, c)}, concat(a, b), false},
		{"a CA listed twice", [][]byte{concat(a, a)}, a, false},
		{"empty", [][]byte{nil}, a, false},
		{"garbage", [][]byte{[]byte("not PEM")}, a, false},
		{"no values", nil, a, false},
	} {
		if got := aheadInRotation(tc.values, tc.ours); got != tc.want {
			t.Errorf("%s: aheadInRotation = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLastWriterIsOurs pins who counts as the last caBundle writer:
// managedFields times have a one-second resolution, and a tie must not
// excuse another field manager.
func TestLastWriterIsOurs(t *testing.T) {
	at := func(s int) time.Time { return fakeStart.Add(time.Duration(s) * time.Second) }
	for _, tc := range []struct {
		name   string
		owners []fieldOwner
		want   bool
	}{
		{"ours alone", []fieldOwner{{manager: "evercert", time: at(1)}}, true},
		{"ours newer", []fieldOwner{{manager: "helm", time: at(1)}, {manager: "evercert", time: at(2)}}, true},
		{"theirs newer", []fieldOwner{{manager: "evercert", time: at(2)}, {manager: "helm", time: at(3)}}, false},
		{"tie", []fieldOwner{{manager: "evercert", time: at(2)}, {manager: "helm", time: at(2)}}, false},
		{"theirs alone", []fieldOwner{{manager: "helm", time: at(2)}}, false},
		{"nobody", nil, false},
	} {
		if got := lastWriterIsOurs(objectView{owners: tc.owners}, "evercert"); got != tc.want {
			t.Errorf("%s: lastWriterIsOurs = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// caLeafAt returns the PEM of a fresh CA issued at now and a leaf it signed
// at now, for a served chain.
func caLeafAt(t *testing.T, name string, now time.Time) ([]byte, *pki.Issued) {
	t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: name, Now: now, Lifetime: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "server", DNSNames: []string{"svc1.ns1.svc"}, Now: now, Lifetime: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return ca.CertPEM, leaf
}

// patchedBundles returns the caBundle values the JSON patches after the
// first skip carry.
func (r *replicaSet) patchedBundles(t *testing.T, skip int) [][]byte {
	t.Helper()
	var out [][]byte
	for _, pa := range r.f.patches()[skip:] {
		var ops []struct {
			Path  string          `json:"path"`
			Value json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &ops); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			if strings.HasSuffix(op.Path, "/caBundle") {
				var b []byte
				if err := json.Unmarshal(op.Value, &b); err != nil {
					t.Fatal(err)
				}
				out = append(out, b)
			}
		}
	}
	return out
}

// TestReplicaAheadBreakingServedChainIsWrittenBack: a replica whose source
// dropped the old CA ([A B] -> [B]) while another replica still serves a
// leaf of A is no harmless step ahead for the one serving that leaf
// (PublisherConfig.Verify): leaving [B] alone for the grace would fail its
// clients' handshakes for 10 s, with its own health check reporting the
// bundle does not verify what it serves. It writes [A B] back at once,
// without any simulated time passing, and counts the change away. Before,
// it held its write back for the grace.
func TestReplicaAheadBreakingServedChainIsWrittenBack(t *testing.T) {
	const name = "ahead-breaks-served"
	key := objectKey(MutatingWebhookConfiguration, name)
	a, leafA := caLeafAt(t, "a", fakeStart.Add(-24*time.Hour))
	b := caAt(t, "b", fakeStart)
	ab := concat(a, b)
	served := newTestServed(leafA)
	r := startReplicasWith(t, Target{Kind: MutatingWebhookConfiguration, Name: name}, func(i int, cfg *PublisherConfig) {
		if i == 1 {
			cfg.Verify = []dynamiccert.ServedChainLister{dynamiccert.ServedBy(served)}
		}
	}, ab, ab)
	for !r.holds(t, ab) {
		r.settle()
	}
	before := len(r.f.patches())
	r.sources[0].set(b)
	// No step of the fake clock: a write held back for the grace never
	// comes.
	for i := 0; ; i++ {
		r.settle()
		got := r.patchedBundles(t, before)
		if slices.ContainsFunc(got, func(v []byte) bool { return bytes.Equal(v, ab) }) {
			if !slices.ContainsFunc(got, func(v []byte) bool { return bytes.Equal(v, b) }) {
				t.Fatal("[A B] written again, but the replica ahead never wrote [B]")
			}
			break
		}
		if i == 200 {
			t.Fatalf("the replica serving a leaf of A left [B], which does not verify it, alone (bundles written since: %d)", len(got))
		}
	}
	eventually(t, 5*time.Second, "the change away counted by the replica serving a leaf of A", func() bool {
		return r.ps[1].contests.gate(key).reverts > 0
	})
}
