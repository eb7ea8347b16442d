package authority

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/evercert/evercert/internal/pki"
)

// TestForeignWriterRolloutDropsPredecessorsCA (simulator, adoption plans:
// seeds 11, 320, 450, 983, 1556 and 1680, A2): a rolling update of
// evercert's pods while the old rotator still answers every adoption with a
// new CA. a adopts the old rotator's CA O1 and serves a leaf of it; the old
// rotator answers with O2, and b, the rollout's next pod, starts on that
// rewrite: it adopts O2 and keeps O1 for a's leaf (from the record of the
// bundle the Authority wrote and a's Lease), and a follows b's write. The
// old rotator answers with O3, a is replaced (a graceful stop deletes its
// Lease), b's episode ends in its adoption of O3, keeping O2 for its own
// leaf, and c starts on that write. O1 is the anchor: the CA adopted when
// the migration began, which stays in ca.crt until it expires
// (docs/migrating.md: a replica cut off since then renews from it). The
// old rotator answers once more (O4), b is replaced by d, and O2, one of
// the old rotator's CAs that was not the anchor and whose only leaf's pod
// is gone, leaves ca.crt (trimmed, or retired and dropped once due).
// Before, b took the rewrite it adopted first (O2) for its own anchor when
// its first episode began and named it no more in OtherWriterCAsAnnotation:
// c, which never read O2 as the old rotator's, kept it as evercert's own
// for its ten years, one CA more in ca.crt per pod of the rollout. The
// anchor is the fleet's (AnchorCAAnnotation), not each pod's first
// adoption.
func TestForeignWriterRolloutDropsPredecessorsCA(t *testing.T) {
	old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
	announced := func(c *Config) { c.DisableReplicaAnnouncements = false }
	adopting := func(c *Config) { c.Adopt = LayoutCertController; announced(c) }
	a := attackAuthority(t, client, clk, "rollout-a", adopting)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	signsWith := func(ca foreignCA, rs ...*Authority) func() bool {
		return func() bool {
			s := getSecret(t, client)
			if _, cc := s.Data["ca.key"]; cc || string(s.Data["tls.crt"]) != string(ca.ca.CertPEM) {
				return false
			}
			for _, r := range rs {
				if r.Status().Stalled || r.Leaf() == nil || r.Leaf().CheckSignatureFrom(ca.ca.Cert) != nil {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, "a's adoption of O1", signsWith(o1, a))
	waitWaiters(t, clk, 1)

	old.rewrite() // O2, its answer to a's adoption
	waitFor(t, "a's hold", func() bool { return a.Status().ForeignWriter != "" })
	b, stopB := startStoppable(t, client, clk, "rollout-b", LayoutCertController, announced)
	o2 := old.latest
	waitFor(t, "b's adoption of O2, a serving O1 and following it", func() bool {
		return signsWith(o2, b)() && a.Status().ForeignWriter == "" && caInBundle(t, getSecret(t, client).Data["ca.crt"], o1.ca)
	})
	require.NoError(t, a.Leaf().CheckSignatureFrom(o1.ca.Cert), "a still serves its leaf of O1")

	clk.Step(5 * time.Second)
	old.rewrite() // O3, its answer to b's adoption
	o3 := old.latest
	waitFor(t, "b's hold", func() bool { return b.Status().ForeignWriter != "" })
	cancel() // the rollout replaces a: its Lease is deleted
	<-done
	waitFor(t, "b to see a's Lease gone", func() bool { return !b.replicas.announces(o1.ca.Cert) })
	// The old rotator is quiet: b's episode ends in its adoption of O3,
	// and c, the rollout's next pod, starts on b's write.
	for steps := 0; !signsWith(o3)() || b.Status().Stalled; steps++ {
		require.Less(t, steps, 120, "b's adoption of O3 once the Secret is left alone")
		clk.Step(5 * time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	c := runAdopting(t, client, clk, "rollout-c", LayoutCertController, announced)
	waitFor(t, "c's start on b's adoption of O3, both publishing ca.crt", func() bool {
		published := string(getSecret(t, client).Data["ca.crt"])
		return signsWith(o3, c)() && !b.Status().Stalled && string(b.CurrentCABundleContent()) == published && string(c.CurrentCABundleContent()) == published
	})
	require.NoError(t, b.Leaf().CheckSignatureFrom(o2.ca.Cert), "b still serves its leaf of O2")
	published := getSecret(t, client).Data["ca.crt"]
	require.True(t, caInBundle(t, published, o2.ca), "O2 stays for b's leaf")
	require.NoError(t, verifiesAt(t, b.Leaf(), published, clk.Now()))
	require.NoError(t, verifiesAt(t, c.Leaf(), published, clk.Now()))
	require.True(t, caInBundle(t, published, o1.ca), "O1, the anchor (adopted when the migration began), left ca.crt")

	clk.Step(5 * time.Second)
	old.rewrite() // O4, its answer to c's adoption
	o4 := old.latest
	waitFor(t, "c's hold", func() bool { return c.Status().ForeignWriter != "" })
	stopB() // the rollout replaces b: its Lease is deleted
	waitFor(t, "c to see b's Lease gone", func() bool { return !c.replicas.announces(o2.ca.Cert) })
	d := runAdopting(t, client, clk, "rollout-d", LayoutCertController, announced)
	waitFor(t, "d's adoption of O4, c following it and both publishing ca.crt", func() bool {
		published := string(getSecret(t, client).Data["ca.crt"])
		return signsWith(o4, d)() && c.Status().ForeignWriter == "" && !c.Status().Stalled &&
			string(c.CurrentCABundleContent()) == published && string(d.CurrentCABundleContent()) == published
	})
	// O2 may have been retired rather than trimmed (retire-after: a leaf
	// lifetime and a check interval): step the clock until it is due.
	for steps := 0; caInBundle(t, getSecret(t, client).Data["ca.crt"], o2.ca); steps++ {
		s := getSecret(t, client)
		require.Less(t, steps, 150, "O2, the old rotator's CA valid for ten years, not the anchor, stays in ca.crt after its only leaf's replica was replaced (ca.crt holds %d CAs, retire-after %q)",
			countCerts(t, s.Data["ca.crt"]), s.Annotations[RetireAfterAnnotation])
		clk.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	published = getSecret(t, client).Data["ca.crt"]
	require.True(t, caInBundle(t, published, o1.ca), "O1, the anchor, left ca.crt")
	require.NoError(t, verifiesAt(t, c.Leaf(), published, clk.Now()))
	require.NoError(t, verifiesAt(t, d.Leaf(), published, clk.Now()))
}

// TestOtherWriterCAsRecord: what OtherWriterCAsAnnotation holds and what a
// reader learns from it.
func TestOtherWriterCAsRecord(t *testing.T) {
	ca := func(cn string) *pki.Issued {
		c, err := pki.NewCA(pki.Request{CommonName: cn, Now: testNow, Lifetime: time.Hour})
		require.NoError(t, err)
		return c
	}
	ours, theirs, recorded, unlisted := ca("ours"), ca("theirs"), ca("recorded"), ca("unlisted")
	st := &caSet{signing: ours, bundle: []*x509.Certificate{ours.Cert, theirs.Cert}}

	w := &foreignWriter{layout: LayoutCertController}
	w.rememberLocked(theirs.Cert)
	w.rememberLocked(unlisted.Cert) // not in ca.crt: not written
	s := &corev1.Secret{}
	w.writeRecord(s, st)
	require.Equal(t, Fingerprint(theirs.Cert), s.Annotations[OtherWriterCAsAnnotation], "the other writer's CAs in ca.crt, none of evercert's")

	r := &foreignWriter{layout: LayoutCertController}
	s.Annotations[OtherWriterCAsAnnotation] += "," + Fingerprint(recorded.Cert) + "," + Fingerprint(unlisted.Cert)
	read := &caSet{signing: ours, bundle: []*x509.Certificate{ours.Cert, theirs.Cert}, recorded: []*x509.Certificate{recorded.Cert}}
	r.learnRecorded(s, read)
	require.Equal(t, []*x509.Certificate{theirs.Cert, recorded.Cert}, r.episode, "the listed CAs of ca.crt and of the recorded bundle; a fingerprint of no CA read is nothing to learn")

	r.writeRecord(s, &caSet{signing: ours, bundle: []*x509.Certificate{ours.Cert}})
	require.NotContains(t, s.Annotations, OtherWriterCAsAnnotation, "none of the other writer's CAs left in ca.crt: no annotation")
	s.Annotations = map[string]string{OtherWriterCAsAnnotation: "x"}
	(&foreignWriter{layout: LayoutEvercert}).writeRecord(s, st)
	require.NotContains(t, s.Annotations, OtherWriterCAsAnnotation, "the Authority's own layout adopts nothing")
	var none *foreignWriter
	none.writeRecord(s, st) // no Config.Adopt
	none.learnRecorded(s, st)
}

// TestAnchorCARecord: what AnchorCAAnnotation holds, what a reader takes
// from it, and that an anchor is never named as the other writer's.
func TestAnchorCARecord(t *testing.T) {
	ca := func(cn string) *pki.Issued {
		c, err := pki.NewCA(pki.Request{CommonName: cn, Now: testNow, Lifetime: time.Hour})
		require.NoError(t, err)
		return c
	}
	anchor, rewrite, edited := ca("anchor"), ca("rewrite"), ca("edited")
	w := &foreignWriter{layout: LayoutCertController, origin: anchor.Cert}
	w.rememberLocked(anchor.Cert)
	w.rememberLocked(rewrite.Cert)
	st := &caSet{signing: &pki.Issued{Cert: rewrite.Cert}, bundle: []*x509.Certificate{anchor.Cert, rewrite.Cert}}
	s := &corev1.Secret{}
	w.writeRecord(s, st)
	require.Equal(t, Fingerprint(anchor.Cert), s.Annotations[AnchorCAAnnotation], "the fleet's anchor")
	require.Equal(t, Fingerprint(rewrite.Cert), s.Annotations[OtherWriterCAsAnnotation], "the anchor is never the other writer's")

	// A pod that starts on the old rotator's rewrite: the anchor is in the
	// recorded bundle only; its own adoption is the other writer's.
	r := &foreignWriter{layout: LayoutCertController}
	r.learnRecorded(s, &caSet{signing: &pki.Issued{Cert: rewrite.Cert}, bundle: []*x509.Certificate{rewrite.Cert}, recorded: []*x509.Certificate{anchor.Cert}})
	require.True(t, r.anchored(anchor.Cert))
	require.False(t, r.anchored(rewrite.Cert))

	// A hand edit names another CA of ca.crt: a process that knows no
	// anchor keeps it as read; one that knows the anchor keeps it and
	// writes it over the edit (review 45: the pods started since learn it).
	st.bundle = append(st.bundle, edited.Cert)
	s.Annotations[AnchorCAAnnotation] = Fingerprint(edited.Cert)
	(&foreignWriter{layout: LayoutCertController}).writeRecord(s, st)
	require.Equal(t, Fingerprint(edited.Cert), s.Annotations[AnchorCAAnnotation], "written as read while it names a CA of ca.crt")
	w.learnRecorded(s, st)
	require.True(t, w.anchored(anchor.Cert), "a hand edit never takes the anchor away")
	w.writeRecord(s, st)
	require.Equal(t, Fingerprint(anchor.Cert), s.Annotations[AnchorCAAnnotation], "the anchor this process knows, written over the edit")

	// A recorded anchor no longer in ca.crt (expired) is replaced by the
	// one this process knows, or removed.
	s.Annotations[AnchorCAAnnotation] = "gone"
	w.writeRecord(s, st)
	require.Equal(t, Fingerprint(anchor.Cert), s.Annotations[AnchorCAAnnotation])
	w.writeRecord(s, &caSet{signing: &pki.Issued{Cert: rewrite.Cert}, bundle: []*x509.Certificate{rewrite.Cert}})
	require.NotContains(t, s.Annotations, AnchorCAAnnotation)
	s.Annotations[AnchorCAAnnotation] = Fingerprint(anchor.Cert)
	(&foreignWriter{layout: LayoutEvercert, origin: anchor.Cert}).writeRecord(s, st)
	require.NotContains(t, s.Annotations, AnchorCAAnnotation, "the Authority's own layout adopts nothing")
}
