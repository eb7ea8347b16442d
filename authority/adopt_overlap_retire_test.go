package authority

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// overlapThenQuiet runs replicas (started with announcements) through an
// overlap of rewrites by old, 20 fake seconds apart, then lets the Secret
// alone until every replica adopted old's last CA once.
func overlapThenQuiet(t *testing.T, old *oldRotator, client *fake.Clientset, clk *clocktesting.FakeClock, rewrites int, replicas ...*Authority) {
	t.Helper()
	adoptedLast := func() bool {
		s := getSecret(t, client)
		_, cc := s.Data["ca.key"]
		if cc || string(s.Data["tls.crt"]) != string(old.latest.ca.CertPEM) {
			return false
		}
		for _, r := range replicas {
			if r.Status().Stalled {
				return false
			}
		}
		return true
	}
	for k := 1; k <= rewrites; k++ {
		old.rewrite()
		waitFor(t, fmt.Sprintf("every replica to hold on rewrite %d", k), func() bool {
			for _, r := range replicas {
				if r.Status().ForeignWriter == "" || !caInBundle(t, r.CurrentCABundleContent(), old.latest.ca) {
					return false
				}
			}
			return true
		})
		clk.Step(20 * time.Second)
	}
	for steps := 0; !adoptedLast(); steps++ {
		require.Less(t, steps, 120, "no adoption of the old rotator's last CA within twenty minutes")
		clk.Step(10 * time.Second)
		time.Sleep(10 * time.Millisecond) // let the loops run
	}
}

// TestForeignWriterRetiresKeptCAsOnceTheirLeavesExpire is issue 27 §8
// bullet 1's "keep only the CAs that a served leaf needs" after the trim.
// An overlap of two episodes: the replicas adopt the old rotator's first
// CA, then its CA at the end of the first episode (second), and serve
// leaves of second by the time the second episode starts; the trim that
// ends it keeps second for those leaves. Nothing signs with second after
// that trim, and it is valid for ten years: before, it stayed in ca.crt
// until then (a run on the real kube-apiserver saw four CAs after the
// first rotation). It must leave once every leaf signed with it can have
// expired (the leaf lifetime and a check interval after the trim), at the
// same time on every replica, with no write back and forth, while both
// replicas' leaves and the old rotator's last leaf verify against the
// published bundle in real TLS handshakes at every step. The CA the
// replicas signed with before the overlap (first) stays, as after any
// adoption: a replica cut off from the API server since then renews from
// it (TestForeignWriterTrimKeepsCAOfPartitionedReplica).
func TestForeignWriterRetiresKeptCAsOnceTheirLeavesExpire(t *testing.T) {
	t.Parallel() // see guard
	for _, layout := range []SecretLayout{LayoutCertController, LayoutCertManager} {
		t.Run(string(layout), func(t *testing.T) { testRetiresKeptCAs(t, layout) })
	}
}

func testRetiresKeptCAs(t *testing.T, layout SecretLayout) {
	old, client, clk, first := oldRotatorSecret(t, layout)
	announced := func(c *Config) { c.DisableReplicaAnnouncements = false }
	a := runAdopting(t, client, clk, "retire-a-"+string(layout), layout, announced)
	b := runAdopting(t, client, clk, "retire-b-"+string(layout), layout, announced)
	replicas := []*Authority{a, b}
	leavesOf := func(ca foreignCA) bool {
		for _, r := range replicas {
			if r.Leaf() == nil || r.Leaf().CheckSignatureFrom(ca.ca.Cert) != nil {
				return false
			}
		}
		return true
	}
	waitFor(t, "both replicas' leaves of the first CA", func() bool { return leavesOf(first) })
	overlapThenQuiet(t, old, client, clk, 3, replicas...)
	second := old.latest
	for steps := 0; !leavesOf(second); steps++ {
		require.Less(t, steps, 120, "the replicas never renewed their leaves from the CA the first episode ended with")
		clk.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	overlapThenQuiet(t, old, client, clk, 2, replicas...)
	last := old.latest
	trimmed := clk.Now()
	s := getSecret(t, client)
	require.True(t, caInBundle(t, s.Data["ca.crt"], second.ca), "the trim keeps the CA the replicas served leaves of during the second episode")
	require.Contains(t, s.Annotations[RetireAfterAnnotation], Fingerprint(second.ca.Cert), "its retirement is recorded in the Secret")
	require.NotContains(t, s.Annotations[RetireAfterAnnotation], Fingerprint(first.ca.Cert), "the CA signed with before the overlap is never retired")
	oldPod, err := dynamiccertificates.NewStaticCertKeyContent("old-pod", last.leaf.CertPEM, last.leaf.KeyPEM)
	require.NoError(t, err)

	// Every leaf of second expires within a leaf lifetime (an hour here)
	// and a check interval (a minute) of the trim.
	// The fake clock moves a minute at a time; at each step every leaf
	// verifies against what the Secret publishes. The loops run behind the
	// clock by as long as the machine makes them: what is checked at a
	// fake time is checked once they caught up (waitFor).
	steps := func(n int) {
		for range n {
			clk.Step(time.Minute)
			time.Sleep(10 * time.Millisecond)
			published := getSecret(t, client).Data["ca.crt"]
			for _, r := range replicas {
				waitFor(t, r.Name()+" to publish what the Secret holds", func() bool { return string(r.CurrentCABundleContent()) == string(getSecret(t, client).Data["ca.crt"]) })
				require.NoError(t, handshakeWith(t, r, published, clk.Now), "%s's leaf against ca.crt at %s", r.Name(), clk.Now())
			}
			require.NoError(t, handshakeWith(t, oldPod, published, clk.Now), "the old rotator's last leaf against ca.crt at %s", clk.Now())
		}
	}
	steps(65)
	waitFor(t, "the CA kept for the leaves served during the second episode, which nothing signs with after the trim, to leave ca.crt a leaf lifetime and a check interval after it", func() bool {
		return !caInBundle(t, getSecret(t, client).Data["ca.crt"], second.ca)
	})
	require.True(t, clk.Now().Before(second.ca.Cert.NotAfter), "it left before it expired")
	steps(60)
	published := getSecret(t, client).Data["ca.crt"]
	t.Logf("%s: the CA kept for the leaves served during the second episode is out of ca.crt %v after the trim (leaf lifetime 1h, check interval 1m); ca.crt holds %d CAs",
		layout, clk.Now().Sub(trimmed), countCerts(t, published))
	require.False(t, caInBundle(t, published, second.ca), "nobody wrote it back")
	require.True(t, caInBundle(t, published, first.ca), "the CA signed with before the overlap stays")
	require.True(t, caInBundle(t, published, last.ca), "the adopted CA")
	require.Equal(t, 2, countCerts(t, published), "ca.crt holds the adopted CA and the one signed with before the overlap")
	require.Empty(t, getSecret(t, client).Annotations[RetireAfterAnnotation], "the record leaves with its CA")

	// No replica writes it back: the Secret stays as it is.
	writes := secretWrites(client)
	for range 30 {
		clk.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	require.Zero(t, writes.Load(), "a replica wrote the Secret again after the retirement (written back and dropped again?)")
	for _, r := range replicas {
		require.NoError(t, r.LastError(), r.Name())
		require.NoError(t, RotationCheck(r).Check(nil), r.Name())
	}
}

// TestRetireWaitsForServedLeaf: a CA past its recorded retirement stays
// in the bundle while a leaf of it is served (this replica's, or one a
// peer's Lease announces: replicaSet.announces), and leaves once none is; it is never
// dropped while it signs or is the successor, and restore does not write
// back a CA another replica retired.
func TestRetireWaitsForServedLeaf(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	old := &oldRotator{t: t, clk: clk, layout: LayoutCertController}
	old.make()
	kept := old.latest.ca.Cert
	old.make()
	signing := old.latest.ca
	served := map[string]bool{}
	serves := func(c *x509.Certificate) bool { return served[Fingerprint(c)] }
	m := machine{sched: rotation{skew: time.Hour}}
	at := clk.Now().Add(time.Hour)
	state := func() *caSet {
		st := &caSet{signing: signing, bundle: []*x509.Certificate{kept, signing.Cert}}
		st.retireAt(kept, at)
		return st
	}

	st := state()
	require.False(t, m.retire(st, at.Add(-time.Second), serves), "before its retirement")
	served[Fingerprint(kept)] = true
	st = state()
	require.False(t, m.retire(st, at.Add(time.Hour), serves), "a live peer serves a leaf of it")
	require.True(t, containsCert(st.bundle, kept))
	served[Fingerprint(kept)] = false
	st = state()
	require.True(t, m.retire(st, at, serves), "nothing serves a leaf of it any more")
	require.False(t, containsCert(st.bundle, kept))
	require.True(t, containsCert(st.bundle, signing.Cert))

	st = state()
	st.retireAt(signing.Cert, at)
	m.retire(st, at, serves)
	require.True(t, containsCert(st.bundle, signing.Cert), "the signing CA is never retired")
	require.NotContains(t, st.retire, Fingerprint(signing.Cert), "and loses its record")

	// Another replica, whose last state still holds the CA, reads the
	// Secret without it: it does not write it back, even if its clock is
	// up to the skew tolerance behind the one that retired it.
	last := state()
	read := &caSet{signing: signing, bundle: []*x509.Certificate{signing.Cert}}
	require.False(t, m.restore(read, last, true, at.Add(-59*time.Minute), nil, serves), "a CA another replica retired is written back")
	require.False(t, containsCert(read.bundle, kept))
	served[Fingerprint(kept)] = true
	require.True(t, m.restore(read, last, true, at, nil, serves), "a CA retired while a live replica serves a leaf of it is written back")
}

// TestForeignWriterTrimDropsSupersededSuccessor: a run of the overlap on
// the real kube-apiserver (test/migrate, cert-controller's CAs valid for
// three minutes) ended with four CAs in ca.crt. The adoption of an old
// rotator's CA that is close to its end publishes a successor of ours at
// once; the old rotator's next rewrite replaces it, and the trim kept that
// successor, which never signed, next to the new one published after the
// trim. Nothing chains to it: the trim leaves it out unless a live
// replica announces a leaf of it, and ca.crt holds at most the adopted
// CA, the CA served during the overlap and the new successor.
func TestForeignWriterTrimDropsSupersededSuccessor(t *testing.T) {
	old, client, clk, first := oldRotatorSecret(t, LayoutCertController)
	// Two hours, under the successor's lead (CALifetime/3 = 8h/3 at a
	// one-hour leaf lifetime): each adoption publishes a successor.
	old.lifetime = 2 * time.Hour
	old.rewrite()
	first = old.latest
	announced := func(c *Config) { c.DisableReplicaAnnouncements = false }
	a := runAdopting(t, client, clk, "superseded-a", LayoutCertController, announced)
	b := runAdopting(t, client, clk, "superseded-b", LayoutCertController, announced)
	var superseded []byte
	waitFor(t, "the adoption's successor", func() bool {
		superseded = getSecret(t, client).Data[NextCertKey]
		return len(superseded) > 0 && a.Leaf() != nil && b.Leaf() != nil
	})
	overlapThenQuiet(t, old, client, clk, 2, a, b)
	for range 6 {
		clk.Step(10 * time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	s := getSecret(t, client)
	published := s.Data["ca.crt"]
	t.Logf("ca.crt after the trim holds %d CAs", countCerts(t, published))
	require.NotContains(t, string(published), string(superseded), "the successor the rewrite replaced, which signed nothing, is left out")
	require.True(t, caInBundle(t, published, first.ca), "the CA the replicas served during the overlap stays")
	require.True(t, caInBundle(t, published, old.latest.ca), "the adopted CA")
	require.LessOrEqual(t, countCerts(t, published), 3, "at most the adopted CA, the one served during the overlap and a new successor")
	for _, r := range []*Authority{a, b} {
		require.NoError(t, handshakeWith(t, r, published, clk.Now), r.Name())
	}
}

// TestForeignWriterRetiresAdoptedCAOnceReplaced (simulator, adoption
// plans: seeds 52, 983 and 1527, A3): the adoption that ends an overlap
// makes the old rotator's last CA sign; evercert's successor replaces it
// (an operator's rotation here; a key store's rotation away from a key
// that was in the Secret, a schedule, an emergency alike). Nothing signs
// with it after that, and it is valid for ten years: it stayed in ca.crt
// until then, one more after every overlap and every pod of a rolling
// update that adopted a rewrite. It must leave once every leaf it signed
// can have expired (a leaf lifetime and a check interval after the
// rotation), while both replicas' leaves verify against ca.crt.
func TestForeignWriterRetiresAdoptedCAOnceReplaced(t *testing.T) {
	old, client, clk, first := oldRotatorSecret(t, LayoutCertController)
	announced := func(c *Config) { c.DisableReplicaAnnouncements = false }
	a := runAdopting(t, client, clk, "replaced-a", LayoutCertController, announced)
	b := runAdopting(t, client, clk, "replaced-b", LayoutCertController, announced)
	replicas := []*Authority{a, b}
	waitFor(t, "both replicas' leaves of the first CA", func() bool {
		return a.Leaf() != nil && b.Leaf() != nil && a.Leaf().CheckSignatureFrom(first.ca.Cert) == nil && b.Leaf().CheckSignatureFrom(first.ca.Cert) == nil
	})
	overlapThenQuiet(t, old, client, clk, 2, replicas...)
	adopted := old.latest

	s := getSecret(t, client).DeepCopy()
	s.Annotations[RotateRequestedAnnotation] = clk.Now().UTC().Format(time.RFC3339)
	_, err := client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
	for steps := 0; string(getSecret(t, client).Data["tls.crt"]) == string(adopted.ca.CertPEM); steps++ {
		require.Less(t, steps, 300, "no rotation away from the adopted CA within five hours")
		clk.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	replaced := clk.Now()
	waitFor(t, "the retirement of the adopted CA recorded", func() bool {
		return strings.Contains(getSecret(t, client).Annotations[RetireAfterAnnotation], Fingerprint(adopted.ca.Cert))
	})

	var left time.Time
	for steps := 0; steps < 180 && left.IsZero(); steps++ {
		clk.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
		published := getSecret(t, client).Data["ca.crt"]
		for _, r := range replicas {
			waitFor(t, r.Name()+" to publish what the Secret holds", func() bool { return string(r.CurrentCABundleContent()) == string(getSecret(t, client).Data["ca.crt"]) })
			require.NoError(t, handshakeWith(t, r, published, clk.Now), "%s's leaf against ca.crt at %s", r.Name(), clk.Now())
		}
		if !caInBundle(t, published, adopted.ca) {
			left = clk.Now()
		}
	}
	require.False(t, left.IsZero(), "the adopted CA, which nothing signs with since %s, is still in ca.crt three hours later", replaced)
	require.Less(t, left.Sub(replaced), time.Hour+5*time.Minute, "left within a leaf lifetime and a check interval of the rotation")
	require.True(t, caInBundle(t, getSecret(t, client).Data["ca.crt"], first.ca), "the CA signed with before the overlap stays")
}
