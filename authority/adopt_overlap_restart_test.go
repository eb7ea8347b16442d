package authority

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// TestForeignWriterRestartedPeerKeepsHoldingPeersCA (simulator, adoption
// plans: seeds 466, 1049 and most S1 findings once the old tool's own
// caBundle injection was modelled): a adopts the old rotator's CA O1 and
// serves a leaf of it; the old rotator answers with O2 and its pods go
// away (the rolling update is over), a holding. b starts then (a restart,
// a rollout's next pod) and reads O2 as its first state. A Lease names a's
// CA by fingerprint only, and the rewrite replaced every key of the Secret
// that held it, so b adopted O2 alone, wrote ca.crt with O2 only and
// published that: a's clients failed (x509: certificate signed by unknown
// authority) until a read b's write and wrote O1 back, or, while the old
// pods still ran, until a's adoption at the end of its quiet period. The
// old rotators keep the annotations, so b now takes O1 from the record of
// the bundle the Authority wrote last (WrittenBundleAnnotation).
//
// With announcements b trusts a recorded CA only once a peer's Lease
// announces a leaf of it (trustRecorded), judged against the recorded CAs
// too (replicaSet.setRoots): without them among the roots, a's
// announcement does not chain to the Secret b reads and b left O1 out.
func TestForeignWriterRestartedPeerKeepsHoldingPeersCA(t *testing.T) {
	old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	adopting := func(c *Config) { c.Adopt = LayoutCertController }
	a := attackAuthority(t, client, clk, "holding-a", adopting)
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, a.Leaf().CheckSignatureFrom(o1.ca.Cert), "a signs with the CA it adopted")
	clk.Step(5 * time.Second)
	old.rewrite() // its answer to the adoption; then its pods are gone
	require.NoError(t, a.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")
	require.NoError(t, a.Leaf().CheckSignatureFrom(o1.ca.Cert), "a serves its leaf of O1 during the hold")

	clk.Step(10 * time.Second)
	b := attackAuthority(t, client, clk, "restarted-b", adopting)
	require.NoError(t, b.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a has not read b's write yet: it holds")
	require.NoError(t, verifiesAt(t, a.Leaf(), b.CurrentCABundleContent(), clk.Now()), "a's served leaf of O1 against the bundle b publishes")
	require.NoError(t, verifiesAt(t, a.Leaf(), getSecret(t, client).Data["ca.crt"], clk.Now()), "a's served leaf of O1 against ca.crt")
}

// TestForeignWriterRestartedPeerKeepsAnnouncedCA is the same with replica
// announcements, a in its Run loops: b trusts a recorded CA only once a
// peer's Lease announces a leaf of it (trustRecorded), and believes that
// announcement only with the recorded CAs among the roots it must chain to
// (replicaSet.setRoots). Without them b left O1 out again: x509:
// certificate signed by unknown authority.
func TestForeignWriterRestartedPeerKeepsAnnouncedCA(t *testing.T) {
	old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
	announced := func(c *Config) { c.Adopt, c.DisableReplicaAnnouncements = LayoutCertController, false }
	a := runAdopting(t, client, clk, "holding-a", LayoutCertController, announced)
	waitFor(t, "a's adoption and its Lease announcing a leaf of O1", func() bool {
		_, cc := getSecret(t, client).Data["ca.key"]
		l, err := client.CoordinationV1().Leases("ns").List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		return !cc && a.Leaf() != nil && a.Leaf().CheckSignatureFrom(o1.ca.Cert) == nil && len(l.Items) == 1 && l.Items[0].Annotations[LeafAnnotation] != ""
	})
	waitWaiters(t, clk, 1)
	old.rewrite() // its answer to the adoption; then its pods are gone
	waitFor(t, "a's hold", func() bool { return a.Status().ForeignWriter != "" })
	// Every write of the Secret from here on is checked as it lands: a's
	// loop reads b's write and writes O1 back at once, so a look at the
	// Secret and b's bundle afterwards misses a write without O1 that was
	// already healed (2 runs in 20 passed with the record ignored).
	writes, err := client.CoreV1().Secrets("ns").Watch(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	defer writes.Stop()

	// b in its Run loops too, as a rolling update's next pod runs.
	b := runAdopting(t, client, clk, "restarted-b", LayoutCertController, announced)
	waitFor(t, "b's leaf and its write", func() bool {
		_, cc := getSecret(t, client).Data["ca.key"]
		return b.Leaf() != nil && !cc
	})
	for n := 0; ; {
		var ev watch.Event
		select {
		case ev = <-writes.ResultChan():
		default:
		}
		s, ok := ev.Object.(*corev1.Secret)
		if !ok {
			require.NotZero(t, n, "b's write was not seen")
			break
		}
		if ev.Type != watch.Modified {
			continue // the fake watch starts with the Secret as it stands
		}
		n++
		require.NoError(t, verifiesAt(t, a.Leaf(), s.Data["ca.crt"], clk.Now()), "a's served leaf of O1 against ca.crt as written (write %d since b started, resourceVersion %s)", n, s.ResourceVersion)
	}
	require.NoError(t, verifiesAt(t, a.Leaf(), b.CurrentCABundleContent(), clk.Now()), "a's served leaf of O1 against the bundle b publishes")
	require.NoError(t, verifiesAt(t, a.Leaf(), getSecret(t, client).Data["ca.crt"], clk.Now()), "a's served leaf of O1 against ca.crt")
}

// TestForeignWriterRestartedPeerKeepsRecordThroughSkewHold (simulator,
// seed 656, S1): as above, b starts on the old rotator's rewrite, but its
// clock is in doubt (here behind the rewrite's CA by more than the skew
// tolerance; in the simulator a process started during a pause, waiting
// for its peers' next renewals). A skew hold keeps the Secret as read in
// force: b took O1 from the record at its first check and lost it at the
// second, and its first write once its clock agreed put ca.crt out with O2
// alone, without the CA a serves its leaf of.
func TestForeignWriterRestartedPeerKeepsRecordThroughSkewHold(t *testing.T) {
	old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	adopting := func(c *Config) { c.Adopt = LayoutCertController }
	a := attackAuthority(t, client, clk, "holding-a", adopting)
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, a.Leaf().CheckSignatureFrom(o1.ca.Cert), "a signs with the CA it adopted")
	clk.Step(5 * time.Second)
	old.rewrite()
	require.NoError(t, a.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")

	behind := clocktesting.NewFakeClock(clk.Now().Add(-2 * time.Hour))
	b := attackAuthority(t, client, behind, "restarted-b", adopting)
	for range 2 {
		require.NoError(t, b.RunOnce(ctx))
		require.NotEmpty(t, b.Status().ClockSkew, "b's clock is behind the rewrite's CA, backdated an hour: it holds")
		require.NoError(t, verifiesAt(t, a.Leaf(), b.CurrentCABundleContent(), clk.Now()), "a's served leaf of O1 against the bundle b publishes while it holds")
		behind.Step(time.Minute)
	}
	behind.SetTime(clk.Now())
	require.NoError(t, b.RunOnce(ctx))
	require.Empty(t, b.Status().ClockSkew, "b's clock agrees")
	require.NoError(t, verifiesAt(t, a.Leaf(), getSecret(t, client).Data["ca.crt"], clk.Now()), "a's served leaf of O1 against the ca.crt b wrote")
	require.NoError(t, verifiesAt(t, a.Leaf(), b.CurrentCABundleContent(), clk.Now()), "a's served leaf of O1 against the bundle b publishes")
}

// TestForeignWriterRestartedPeerIgnoresGarbledRecord: a record of the CAs
// the Authority wrote last (WrittenBundleAnnotation) that does not parse
// is left out, and the replica that starts on the old rotator's rewrite
// adopts it as before the record existed: no error, a leaf served.
func TestForeignWriterRestartedPeerIgnoresGarbledRecord(t *testing.T) {
	old, client, clk, _ := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	adopting := func(c *Config) { c.Adopt = LayoutCertController }
	a := attackAuthority(t, client, clk, "holding-a", adopting)
	require.NoError(t, a.RunOnce(ctx))
	require.NotEmpty(t, getSecret(t, client).Annotations[WrittenBundleAnnotation], "an adopting Authority records the bundle it wrote")
	old.rewrite()
	s := getSecret(t, client).DeepCopy()
	s.Annotations[WrittenBundleAnnotation] = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
	_, err := client.CoreV1().Secrets("ns").Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)

	b := attackAuthority(t, client, clk, "restarted-b", adopting)
	require.NoError(t, b.RunOnce(ctx))
	require.NoError(t, b.LastError())
	require.NotNil(t, b.Leaf())
	require.NoError(t, verifiesAt(t, b.Leaf(), getSecret(t, client).Data["ca.crt"], clk.Now()))
}

// TestTrustRecorded: what a process with no state in force takes from
// the record of the CAs the Authority wrote last, and when.
func TestTrustRecorded(t *testing.T) {
	ca := func(cn string, lifetime time.Duration) *pki.Issued {
		c, err := pki.NewCA(pki.Request{CommonName: cn, Now: testNow.Add(-time.Hour), Lifetime: lifetime})
		require.NoError(t, err)
		return c
	}
	signing, served, unserved, compromised, expired := ca("rewrite", 48*time.Hour), ca("served", 48*time.Hour), ca("unserved", 48*time.Hour), ca("compromised", 48*time.Hour), ca("expired", 30*time.Minute)
	leaf := issueTestPair(t, "leaf", testNow, time.Hour)
	record := string(slices.Concat(served.CertPEM, unserved.CertPEM, compromised.CertPEM, expired.CertPEM, leaf.CertPEM, signing.CertPEM))
	m := machine{writer: &foreignWriter{retireIn: time.Hour}}
	store := &secretStore{cfg: &Config{Name: "test"}}
	var retire retirements
	read := func(written string, last *caSet, peerServes func(*x509.Certificate) bool, blind string) []*x509.Certificate {
		st := &caSet{signing: signing, bundle: []*x509.Certificate{signing.Cert}}
		st.ops.compromised = Fingerprint(compromised.Cert)
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{WrittenBundleAnnotation: record, WrittenCAAnnotation: written}}}
		st.recorded = store.recordedBundle(s, st)
		m.trustRecorded(st, stepInput{now: testNow, read: st, last: last, peerServes: peerServes, obs: observation{blind: func() string { return blind }}})
		retire = st.retire
		return st.bundle
	}
	peerServes := func(c *x509.Certificate) bool { return !c.Equal(unserved.Cert) }
	rewritten := Fingerprint(served.Cert)
	require.Equal(t, []*x509.Certificate{signing.Cert, served.Cert}, read(rewritten, nil, peerServes, ""), "rewritten since the last write: the recorded CAs still valid, not marked and that a peer may serve; never a leaf, never twice")
	require.Equal(t, retirements{Fingerprint(served.Cert): testNow.Add(time.Hour)}, retire, "retired once its leaves can have expired, unless a peer still serves one")
	require.Equal(t, []*x509.Certificate{signing.Cert, served.Cert, unserved.Cert}, read(rewritten, nil, nil, ""), "without announcements every valid recorded CA")
	require.Empty(t, retire, "without announcements a peer's leaf is unknown: kept until it expires")
	require.Equal(t, []*x509.Certificate{signing.Cert, served.Cert, unserved.Cert}, read(rewritten, nil, peerServes, "listing Leases is forbidden"), "a process that cannot see the Leases takes every valid recorded CA")
	require.Equal(t, []*x509.Certificate{signing.Cert}, read(rewritten, &caSet{signing: signing}, peerServes, ""), "a process with a state in force keeps its own memory")
	require.Equal(t, []*x509.Certificate{signing.Cert}, read(Fingerprint(signing.Cert), nil, peerServes, ""), "the Authority's own write: the data are the record")
	require.Equal(t, []*x509.Certificate{signing.Cert}, read("", nil, peerServes, ""), "no write of the Authority's")

	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
	s.Data = map[string][]byte{"ca.crt": served.CertPEM}
	writeBundleRecord(s, LayoutEvercert)
	require.NotContains(t, s.Annotations, WrittenBundleAnnotation, "the Authority's own layout has no old rotator to survive")
	writeBundleRecord(s, LayoutKnative)
	require.Equal(t, string(served.CertPEM), s.Annotations[WrittenBundleAnnotation])
}

// TestForeignWriterRestartedPeerUsesCutRecord: a record over the bound
// (maxRecordedTrust; a ca.crt that grew one CA per episode without
// announcements) is cut, not thrown away whole, and the replica that
// starts on the old rotator's rewrite still trusts the CA its holding peer
// serves (a review found a record over 16 CAs dropped whole).
func TestForeignWriterRestartedPeerUsesCutRecord(t *testing.T) {
	old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
	ctx := context.Background()
	adopting := func(c *Config) { c.Adopt = LayoutCertController }
	a := attackAuthority(t, client, clk, "holding-a", adopting)
	require.NoError(t, a.RunOnce(ctx))
	old.rewrite()
	require.NoError(t, a.RunOnce(ctx))
	require.NotEmpty(t, a.Status().ForeignWriter, "a holds")
	record := slices.Clone(o1.ca.CertPEM)
	for i := range maxRecordedTrust {
		c, err := pki.NewCA(pki.Request{CommonName: fmt.Sprintf("earlier-%d", i), Now: testNow, Lifetime: 48 * time.Hour})
		require.NoError(t, err)
		record = append(record, c.CertPEM...)
	}
	s := getSecret(t, client).DeepCopy()
	s.Annotations[WrittenBundleAnnotation] = string(record)
	_, err := client.CoreV1().Secrets("ns").Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)

	b := attackAuthority(t, client, clk, "restarted-b", adopting)
	require.NoError(t, b.RunOnce(ctx))
	require.NoError(t, b.LastError())
	require.NoError(t, verifiesAt(t, a.Leaf(), b.CurrentCABundleContent(), clk.Now()), "a's served leaf of O1 against the bundle b publishes")
	require.LessOrEqual(t, countCerts(t, getSecret(t, client).Data["ca.crt"]), maxRecordedTrust+1, "the rewrite's CA and the first %d recorded", maxRecordedTrust)
}
