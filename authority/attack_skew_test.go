package authority

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
)

// skewedReplica starts an Authority on the shared clock shifted by offset.
func skewedReplica(t *testing.T, client *fake.Clientset, base *clocktesting.FakeClock, id string, offset time.Duration, mutate func(*Config)) *Authority {
	t.Helper()
	cfg := Config{
		Name: "attack-skew-" + id, Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: id,
		Hosts: []string{"localhost"}, Clock: offsetClock{base, offset}, DisableReplicaAnnouncements: true,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := New(cfg)
	require.NoError(t, err)
	runInBackground(t, a.Run)
	return a
}

// TestAttackSkewBeyondToleranceConverges: two replicas whose clocks are
// three hours apart, three times the default one-hour tolerance, without
// replica Leases. The slow one finds the fast one's CA not yet valid. It
// used to make its own (an unsafe rotation) and write it over the CA every
// client of the fast replica trusted. Its own clock is the suspect: it must
// not write the Secret at all, nor serve a leaf dated by its clock, and it
// says so in Status. Nor may the two write the Secret back and forth.
func TestAttackSkewBeyondToleranceConverges(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	writes := secretWrites(client)
	base := clocktesting.NewFakeClock(testNow)

	fast := skewedReplica(t, client, base, "fast", 3*time.Hour, nil)
	waitFor(t, "the fast replica's CA", func() bool { return fast.Leaf() != nil })
	settle(t, base, 1, client, writes, 3, fast)
	before := writes.Load()

	slow := skewedReplica(t, client, base, "slow", 0, nil)
	waitFor(t, "the slow replica to find its clock skewed", func() bool { return slow.Status().ClockSkew != "" })
	settle(t, base, 2, client, writes, 0, fast, slow)
	assert.Equal(t, before, writes.Load(), "Secret writes after the slow replica started")
	assert.Contains(t, slow.Status().ClockSkew, "this clock is behind")
	assert.Nil(t, slow.Leaf(), "a leaf dated by the slow clock")

	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Len(t, mustParseBundle(t, s.Data[dynamiccert.SecretCAKey]), 1, "ca.crt")
	require.NoError(t, verifiesAt(t, fast.Leaf(), s.Data[dynamiccert.SecretCAKey], base.Now().Add(3*time.Hour)), "%s", fast.Name())
	assert.Zero(t, fast.Status().UnsafeRotations+slow.Status().UnsafeRotations)

	// Once the slow clock reaches the CA's validity, it takes part again
	// and makes its own leaf.
	base.Step(2*time.Hour + time.Minute)
	// The check the step wakes may meet the fast replica's own wake-up
	// (its cache being updated, a conflict) and retry after a backoff on
	// the fake clock: step on, a minute at a time, for at most an hour of
	// it, while waiting.
	steps := 0
	last := time.Now()
	waitFor(t, "the slow replica's leaf within an hour of its clock reaching the CA's validity", func() bool {
		if slow.Leaf() != nil {
			return true
		}
		if steps < 60 && time.Since(last) > 200*time.Millisecond {
			base.Step(time.Minute)
			steps, last = steps+1, time.Now()
		}
		return false
	})
	assert.Empty(t, slow.Status().ClockSkew)
	require.NoError(t, verifiesAt(t, slow.Leaf(), s.Data[dynamiccert.SecretCAKey], base.Now()), "%s", slow.Name())
}

// TestAttackSkewWithinToleranceRetire: replicas four minutes apart with a
// five-minute tolerance run through the retirement of the first CA. The
// replica whose clock is ahead prunes the expired CA from ca.crt first; the
// one behind must not take that for a rollback and write the CA back, or
// the two flip ca.crt at API latency until the slow clock catches up.
func TestAttackSkewWithinToleranceRetire(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	writes := secretWrites(client)
	base := clocktesting.NewFakeClock(testNow)
	short := func(c *Config) { c.Lifetime = time.Hour } // skew tolerance: RenewBefore/4 = 5m
	ahead := skewedReplica(t, client, base, "ahead", 4*time.Minute, short)
	waitFor(t, "the first CA", func() bool { return ahead.Leaf() != nil })
	behind := skewedReplica(t, client, base, "behind", 0, short)
	waitFor(t, "the second replica", func() bool { return behind.Leaf() != nil })
	require.Equal(t, 5*time.Minute, ahead.cfg.SkewTolerance)
	settle(t, base, 2, client, writes, 3, ahead, behind)
	first := ahead.Status().Signing

	// Through the first CA's expiry (on either clock) in one-minute steps.
	for base.Now().Before(first.NotAfter.Add(10 * time.Minute)) {
		step := time.Minute
		if base.Now().Before(first.NotAfter.Add(-30 * time.Minute)) {
			step = 10 * time.Minute
		}
		base.Step(step)
		settle(t, base, 2, client, writes, 4, ahead, behind)
	}
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	for _, c := range mustParseBundle(t, s.Data[dynamiccert.SecretCAKey]) {
		assert.NotEqual(t, first.Serial, serial(c), "the expired CA is back in ca.crt")
	}
	for _, a := range []*Authority{ahead, behind} {
		assert.Zero(t, a.Status().UnsafeRotations, fmt.Sprint(a.Name()))
	}
}

// TestAttackSkewJudgedAtTheDecisionsTime: the clock-skew judgement and the
// decision it guards must look at one instant. The issuer reads the time,
// then the store reads the Secret and judges it; a clock that moved in
// between (a pause, a step) used to be judged at the later time, which
// found a CA valid that the decision, at the earlier time, found not yet
// valid and replaced: an unsafe rotation over the CA every other replica
// trusts (seen once in TestAttackSkewBeyondToleranceConverges under load).
func TestAttackSkewJudgedAtTheDecisionsTime(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	writes := secretWrites(client)
	base := clocktesting.NewFakeClock(testNow)
	fast := skewedReplica(t, client, base, "fast", 3*time.Hour, nil)
	waitFor(t, "the fast replica's CA", func() bool { return fast.Leaf() != nil })
	settle(t, base, 1, client, writes, 3, fast)

	cfg := Config{
		Name: "attack-skew-judged", Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: "judged",
		Hosts: []string{"localhost"}, Clock: base, DisableReplicaAnnouncements: true,
	}
	a, err := New(cfg)
	require.NoError(t, err)
	decideAt := base.Now()
	base.Step(2*time.Hour + time.Minute) // the fast CA is valid from here on
	before := writes.Load()
	decided := false
	m := a.machine()
	_, err = a.store.update(context.Background(), decideAt, func(in stepInput) (stepResult, error) {
		in.obs = observation{all: a.observed, local: a.locallyObserved}
		res, err := m.step(in)
		decided = res.skew == nil
		return res, err
	})
	var skew *clockSkewError
	require.ErrorAs(t, err, &skew, "the CA is not yet valid at the time of the decision")
	assert.Contains(t, skew.reason, "this clock is behind")
	assert.False(t, decided, "decided on a CA the judgement never saw as not yet valid")
	assert.Equal(t, before, writes.Load(), "Secret writes")
}
