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
// Lease) by c, which adopts O3 and keeps O2 for b's leaf. b, reading c's
// write, ends its episode with a trim that keeps only the old rotator's CAs
// a served leaf needs: but b learned O1 from the record, never as the old
// rotator's CA, and kept it as evercert's own, valid for ten years with no
// leaf of it served: one CA more in ca.crt per pod of the rollout. Every
// write now names the old rotator's CAs in ca.crt (OtherWriterCAsAnnotation),
// so b knows O1 for what it is.
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
	b := runAdopting(t, client, clk, "rollout-b", LayoutCertController, announced)
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
	c := runAdopting(t, client, clk, "rollout-c", LayoutCertController, announced)
	waitFor(t, "c's adoption of O3, b following it and both publishing ca.crt", func() bool {
		published := string(getSecret(t, client).Data["ca.crt"])
		return signsWith(o3, c)() && b.Status().ForeignWriter == "" && !b.Status().Stalled &&
			string(b.CurrentCABundleContent()) == published && string(c.CurrentCABundleContent()) == published
	})
	require.NoError(t, b.Leaf().CheckSignatureFrom(o2.ca.Cert), "b still serves its leaf of O2")
	published := getSecret(t, client).Data["ca.crt"]
	require.True(t, caInBundle(t, published, o2.ca), "O2 stays for b's leaf")
	require.NoError(t, verifiesAt(t, b.Leaf(), published, clk.Now()))
	require.NoError(t, verifiesAt(t, c.Leaf(), published, clk.Now()))
	require.False(t, caInBundle(t, published, o1.ca), "O1, the old rotator's CA valid for ten years, stays in ca.crt after its only leaf's replica was replaced (ca.crt holds %d CAs)", countCerts(t, published))
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
