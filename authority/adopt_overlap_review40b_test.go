package authority

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/pki"
)

// TestForeignWriterTrimKeepsPeersServingCA (review40b): a rolling update
// from cert-controller's pods; replica a adopts the first CA, the old
// rotator rewrites, replica b starts and adopts that second CA (its first
// read) and serves a leaf of it, the old rotator rewrites again and both
// hold. b is then slow (its checks stop: paused, cut off from the API)
// while it keeps serving; a adopts once the Secret is quiet and trims
// ca.crt. The trim must not drop the CA b's served leaf chains to: every
// client that takes the bundle then would fail b's handshakes with
// "x509: certificate signed by unknown authority".
func TestForeignWriterTrimKeepsPeersServingCA(t *testing.T) {
	old, client, clk, _ := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	adopting := func(c *Config) { c.Adopt = LayoutCertController }
	a := attackAuthority(t, client, clk, "trim-peer-a", adopting)
	require.NoError(t, a.RunOnce(ctx))
	clk.Step(5 * time.Second)
	old.rewrite()
	second := old.latest
	b := attackAuthority(t, client, clk, "trim-peer-b", adopting)
	require.NoError(t, b.RunOnce(ctx))
	require.NoError(t, b.Leaf().CheckSignatureFrom(second.ca.Cert), "b signs with the CA it adopted")
	require.NoError(t, a.RunOnce(ctx))
	clk.Step(5 * time.Second)
	old.rewrite()
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, b.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")
	t.Logf("a's bundle before the trim holds b's CA: %v", caInBundle(t, a.CurrentCABundleContent(), second.ca))

	// b stops checking; a adopts once the Secret is left alone.
	for steps := 0; a.Status().ForeignWriter != ""; steps++ {
		require.Less(t, steps, 30, "a never adopted")
		clk.Step(time.Minute)
		require.NoError(t, a.RunOnce(ctx))
	}
	require.NoError(t, a.RunOnce(ctx))
	trusted := getSecret(t, client).Data["ca.crt"]
	require.NoError(t, verifiesAt(t, b.Leaf(), trusted, clk.Now()), "b's served leaf against ca.crt after a's trim")
	require.NoError(t, verifiesAt(t, b.Leaf(), a.CurrentCABundleContent(), clk.Now()), "b's served leaf against a's published bundle after its trim")
}

// TestForeignWriterHoldsKnativeRewrites (review40b): docs/migrating.md and
// foreignWriter say a rewrite in knative's layout after the adoption is
// held like cert-controller's. knative's reconciler regenerates its CA and
// leaf into ca-cert.pem, server-cert.pem and server-key.pem of the Secret
// as read (the Authority's ca.crt and successor stay). Each rewrite must be
// held (ForeignWriter) and ca.crt must not collect one CA per rewrite.
func TestForeignWriterHoldsKnativeRewrites(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	client := fake.NewClientset()
	gen := &oldRotator{t: t, client: client, clk: clk, layout: LayoutKnative}
	gen.make()
	ctx := context.Background()
	_, err := client.CoreV1().Secrets("ns").Create(ctx, opaqueSecret(gen.latest.knative()), metav1.CreateOptions{})
	require.NoError(t, err)
	optimistic(client)
	a := attackAuthority(t, client, clk, "knative-overlap", func(c *Config) { c.Adopt = LayoutKnative })
	require.NoError(t, a.RunOnce(ctx))
	require.NotEmpty(t, getSecret(t, client).Data["ca.crt"], "the adoption wrote ca.crt")
	start := countCerts(t, getSecret(t, client).Data["ca.crt"])
	held := false
	for k := 1; k <= 5; k++ {
		clk.Step(5 * time.Second)
		gen.make()
		s := getSecret(t, client).DeepCopy()
		for key, v := range gen.latest.knative() {
			s.Data[key] = v
		}
		_, err := client.CoreV1().Secrets("ns").Update(ctx, s, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.NoError(t, a.RunOnce(ctx))
		held = held || a.Status().ForeignWriter != ""
	}
	end := countCerts(t, getSecret(t, client).Data["ca.crt"])
	require.True(t, held, "no hold on five rewrites by knative's reconciler (ca.crt went from %d to %d CAs)", start, end)
	require.LessOrEqual(t, end, start+1, "ca.crt collects knative's CAs")
	for steps := 0; a.Status().ForeignWriter != ""; steps++ {
		require.Less(t, steps, 30, "no adoption within half an hour of knative's last rewrite")
		clk.Step(time.Minute)
		require.NoError(t, a.RunOnce(ctx))
	}
	require.NoError(t, a.RunOnce(ctx))
	trusted := getSecret(t, client).Data["ca.crt"]
	require.LessOrEqual(t, countCerts(t, trusted), 3, "ca.crt after the adoption")
	require.True(t, caInBundle(t, trusted, gen.latest.ca), "knative's last CA (its pods serve its last leaf) is trusted")
	require.NoError(t, verifiesAt(t, a.Leaf(), trusted, clk.Now()), "the replica's served leaf against ca.crt")
}

// TestForeignWriterEpisodeMemoryBounded (review40b): an old rotator that
// never stops rewriting more often than the quiet period (a crash-looping
// old pod, a tool rotating on every resync) holds for good; foreignWriter
// keeps every CA it read during the episode (episode), a whole
// certificate per rewrite, for as long as the hold lasts. A day of
// rewrites every 30 seconds (2880) must not keep 2880 certificates.
func TestForeignWriterEpisodeMemoryBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	old := &oldRotator{t: t, clk: clk, layout: LayoutCertController}
	old.make()
	first := old.latest.ca
	w := &foreignWriter{name: "episode-memory", key: "ns/ca", layout: LayoutCertController,
		report: newReporter("episode-memory", nil, nil), quiet: backoff.New(time.Minute, 10*time.Minute)}
	last := &caSet{signing: first, bundle: []*x509.Certificate{first.Cert}}
	const rewrites = 2880
	for k := 0; k < rewrites; k++ {
		clk.Step(30 * time.Second)
		old.make()
		read := &caSet{signing: old.latest.ca, bundle: []*x509.Certificate{old.latest.ca.Cert}}
		hold, _ := w.decide(stepInput{now: clk.Now(), read: read, exists: true, last: last, adopted: true})
		require.NotNil(t, hold, "rewrite %d 30s after the last one is held", k)
	}
	require.LessOrEqual(t, len(w.episode), 100, "certificates kept by one hold after %d rewrites", rewrites)
}

// TestForeignWriterNoHoldOnPeersRecreatedSecret (review40b): in
// cert-manager's layout (the Authority's own) with replica announcements
// off, the Authority's writes carry no evercert.io annotation. The Secret
// is deleted; a replica that just started (nothing in force) recreates it
// first, with a new CA alone in tls.crt and ca.crt. That is a peer's
// write, not cert-manager's webhook still running: replica a must not hold
// on it (nor send the Warning "the old rotator still runs"), and must not
// then trim ca.crt to its own serving CA.
func TestForeignWriterNoHoldOnPeersRecreatedSecret(t *testing.T) {
	_, client, clk, _ := oldRotatorSecret(t, LayoutCertManager)
	ctx := context.Background()
	adopting := func(c *Config) { c.Adopt = LayoutCertManager }
	a := attackAuthority(t, client, clk, "recreated-a", adopting)
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, client.CoreV1().Secrets("ns").Delete(ctx, "ca", metav1.DeleteOptions{}))
	clk.Step(5 * time.Second)
	c := attackAuthority(t, client, clk, "recreated-c", adopting)
	require.NoError(t, c.RunOnce(ctx))
	s := getSecret(t, client)
	t.Logf("recreated by c: %d CA(s) in ca.crt, annotations %v", countCerts(t, s.Data["ca.crt"]), s.Annotations)
	require.NoError(t, a.RunOnce(ctx))
	require.Empty(t, a.Status().ForeignWriter, "a takes its peer's recreation for cert-manager's rewrite")
}

// TestForeignWriterTrimWithAnnouncements: after a second episode (the old
// rotator answered the first adoption with a new CA), the CA the first
// episode adopted is the other writer's and is in the Secret as it stood
// before the second. With announcements, the trim keeps it exactly when a
// live peer's Lease announces a leaf it signed; without them, a peer's
// leaf is unknown and it stays. This replica's own serving CA, and the
// CA adopted now, always stay.
func TestForeignWriterTrimWithAnnouncements(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	old := &oldRotator{t: t, clk: clk, layout: LayoutCertController}
	newWriter := func() *foreignWriter {
		return &foreignWriter{name: "trim-announced", key: "ns/ca", layout: LayoutCertController,
			report: newReporter("trim-announced", nil, nil), quiet: backoff.New(time.Minute, 10*time.Minute)}
	}
	old.make()
	ca0 := old.latest.ca.Cert
	old.make()
	caX := old.latest.ca.Cert
	old.make()
	ca1 := old.latest.ca.Cert
	old.make()
	ca2 := old.latest.ca.Cert
	// This replica adopted ca0; the first episode's rewrites were caX then
	// ca1, which it adopted at the episode's end, and it serves a leaf of
	// ca1 (caX had been published while held); the old rotator answered
	// with ca2.
	last := &caSet{signing: &pki.Issued{Cert: ca1}, bundle: []*x509.Certificate{ca0, caX, ca1}}
	kept := func(peerServes func(*x509.Certificate) bool) []*x509.Certificate {
		w := newWriter()
		w.decide(stepInput{now: clk.Now(), read: &caSet{signing: &pki.Issued{Cert: ca0}, bundle: []*x509.Certificate{ca0}}, exists: true, adopted: true})
		before := &caSet{signing: &pki.Issued{Cert: ca0}, bundle: []*x509.Certificate{ca0}}
		w.decide(stepInput{now: clk.Now(), read: &caSet{signing: &pki.Issued{Cert: caX}, bundle: []*x509.Certificate{caX}}, exists: true, last: before, adopted: true})
		w.decide(stepInput{now: clk.Now(), read: &caSet{signing: &pki.Issued{Cert: ca1}, bundle: []*x509.Certificate{ca1}}, exists: true, last: before, adopted: true})
		w.settled(clk.Now())
		hold, _ := w.decide(stepInput{now: clk.Now(), read: &caSet{signing: &pki.Issued{Cert: ca2}, bundle: []*x509.Certificate{ca2}}, exists: true, last: last, adopted: true})
		require.NotNil(t, hold, "ca2 is a rewrite")
		return w.kept(last, ca1, peerServes)
	}
	none := func(*x509.Certificate) bool { return false }
	peerOnCAX := func(c *x509.Certificate) bool { return c.Equal(caX) }

	got := kept(none)
	require.True(t, containsCert(got, ca1), "this replica's serving CA stays")
	require.True(t, containsCert(got, ca0), "the CA signed with before the overlap stays (a replica cut off since renews from it)")
	require.False(t, containsCert(got, caX), "the first episode's CA that nothing signed with, and no Lease announces a leaf of, is trimmed")
	got = kept(peerOnCAX)
	require.True(t, containsCert(got, caX), "a CA a peer's Lease announces a leaf of stays")
	got = kept(nil)
	require.True(t, containsCert(got, caX), "without announcements every CA the Secret had before the episode stays")
}
