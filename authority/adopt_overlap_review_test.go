package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// The review of the first attempt at issue 27 §8 bullet 1 (commit
// bbfd684's message) found the hold on another writer's rewrites unsafe in
// three ways besides the readiness deadlock (TestAdoptWhileOldRotatorStillWrites
// checks readiness stays green): these are its Run-loop tests.

// oldRotatorSecret creates the Secret an old rotator of layout wrote, on
// a fake API server that enforces resourceVersions, and returns the
// rotator and its first CA.
func oldRotatorSecret(t *testing.T, layout SecretLayout) (*oldRotator, *fake.Clientset, *clocktesting.FakeClock, foreignCA) {
	t.Helper()
	clk := clocktesting.NewFakeClock(testNow)
	client := fake.NewClientset()
	old := &oldRotator{t: t, client: client, clk: clk, layout: layout}
	_, err := client.CoreV1().Secrets("ns").Create(context.Background(), opaqueSecret(old.make()), metav1.CreateOptions{})
	require.NoError(t, err)
	optimistic(client)
	return old, client, clk, old.latest
}

// holdingReplica starts one replica adopting the cert-controller Secret
// old writes, waits for its adoption and for it to hold on old's first
// rewrite of the overlap.
func holdingReplica(t *testing.T, name string) (*Authority, *oldRotator, *fake.Clientset, *clocktesting.FakeClock, foreignCA) {
	t.Helper()
	old, client, clk, first := oldRotatorSecret(t, LayoutCertController)
	a := runAdopting(t, client, clk, name, LayoutCertController, nil)
	waitFor(t, "the adoption", func() bool {
		_, cc := getSecret(t, client).Data["ca.key"]
		return !cc && a.Leaf() != nil
	})
	waitWaiters(t, clk, 1)
	old.rewrite()
	waitFor(t, "the hold", func() bool { return a.Status().ForeignWriter != "" })
	return a, old, client, clk, first
}

func caInBundle(t *testing.T, bundle []byte, ca *pki.Issued) bool {
	t.Helper()
	certs, err := pki.ParseCABundle(bundle)
	require.NoError(t, err)
	for _, c := range certs {
		if c.Equal(ca.Cert) {
			return true
		}
	}
	return false
}

// TestForeignWriterHoldActsOnCompromisedMark (review finding 3): while the
// old rotator keeps rewriting the Secret, the operator marks compromised
// the CA the replica signs with. The mark is acted on at once, whatever
// the hold: within a few of the old rotator's rewrites the replica serves
// no leaf of that CA and its bundle drops it. (The first attempt held on
// every rewrite and ignored the mark for as long as the rewrites went on.)
func TestForeignWriterHoldActsOnCompromisedMark(t *testing.T) {
	a, old, client, clk, first := holdingReplica(t, "overlap-mark")
	require.NoError(t, a.Leaf().CheckSignatureFrom(first.ca.Cert), "the adopted CA signs before the mark")
	s := getSecret(t, client).DeepCopy()
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[CompromisedCAAnnotation] = Fingerprint(first.ca.Cert)
	_, err := client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
	acted := func() bool {
		leaf := a.Leaf()
		return leaf != nil && leaf.CheckSignatureFrom(first.ca.Cert) != nil && !caInBundle(t, a.CurrentCABundleContent(), first.ca)
	}
	for k := 0; !acted(); k++ {
		require.Less(t, k, 6, "the compromised CA still signs or is still published after %d rewrites by the old rotator (ForeignWriter %q)", k, a.Status().ForeignWriter)
		clk.Step(5 * time.Second)
		old.rewrite()
		waitWaiters(t, clk, 1)
		waitFor(t, "the replica to read the rewrite", func() bool { return a.LastError() == nil })
	}
	// Whether the replica holds again afterwards is not this test's: once
	// the emergency has taken the marked CA out of the state in force and
	// the old rotator's rewrite out of the Secret, the mark names no CA
	// in force and no longer ends a hold (operatorRequests.pending,
	// TestForeignWriterHoldsWithIgnoredCompromisedMark), whether or not a
	// replica recorded it handled first.
}

// TestForeignWriterTrimmedCANeverSignsAgain (review finding 4): the old
// rotator rewrote the Secret twice during the overlap; a backup taken
// between the two is restored after the replica adopted the last one and
// trimmed ca.crt (the backup's CA is not in it). The backup's CA must not
// sign: clients hold the trimmed bundle. Every handshake with the bundle
// published after the trim verifies, and the replica signs with the CA it
// adopted last.
func TestForeignWriterTrimmedCANeverSignsAgain(t *testing.T) {
	a, old, client, clk, _ := holdingReplica(t, "overlap-backup")
	backup := getSecret(t, client).DeepCopy()
	middle := old.latest
	clk.Step(20 * time.Second)
	old.rewrite()
	last := old.latest
	waitFor(t, "the second rewrite to be read", func() bool { return a.Status().ForeignWriter != "" && a.Status().Signing.CommonName != "" })
	for steps := 0; ; steps++ {
		require.Less(t, steps, 60, "no adoption within ten minutes of the old rotator's last write")
		clk.Step(10 * time.Second)
		waitWaiters(t, clk, 1)
		s := getSecret(t, client)
		if _, cc := s.Data["ca.key"]; !cc && a.Status().ForeignWriter == "" && string(s.Data["tls.crt"]) == string(last.ca.CertPEM) {
			break
		}
	}
	for range 3 {
		clk.Step(10 * time.Second)
		waitWaiters(t, clk, 1)
	}
	trusted := getSecret(t, client).Data["ca.crt"]
	require.False(t, caInBundle(t, trusted, middle.ca), "the trim left the overlap's middle CA out")
	require.NoError(t, handshakeWith(t, a, trusted, clk.Now))

	// The backup from the overlap is restored.
	s := getSecret(t, client).DeepCopy()
	s.Data, s.Annotations = backup.Data, backup.Annotations
	_, err := client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
	for range 60 {
		clk.Step(10 * time.Second)
		waitWaiters(t, clk, 1)
		require.NoError(t, handshakeWith(t, a, trusted, clk.Now), "a client holding the bundle published after the trim, at %s", clk.Now())
		leaf := a.Leaf()
		require.NotNil(t, leaf)
		require.Error(t, leaf.CheckSignatureFrom(middle.ca.Cert), "the trimmed CA signs again")
		require.NotEqual(t, Fingerprint(middle.ca.Cert), a.Status().Signing.Fingerprint, "the trimmed CA is the signing CA again")
	}
	require.Equal(t, Fingerprint(last.ca.Cert), a.Status().Signing.Fingerprint, "the CA adopted last signs")
	require.Empty(t, a.Status().ForeignWriter, "a restored backup is a rollback, not another writer's rewrite")
}

// TestForeignWriterHoldNeverTakesPeersEmergency (review finding 2): with
// cert-manager's layout, which is the Authority's own, replica a adopts
// the Secret and is then paused (its checks stop); replica b handles an
// emergency meanwhile: the adopted CA is marked compromised, b's successor
// signs and the compromised CA leaves ca.crt, which leaves one CA in
// tls.crt and ca.crt, as cert-manager writes. When a wakes it must follow
// the peer, not take it for cert-manager's rewrite: no hold, no leaf of
// the compromised CA, and its bundle does not publish it.
func TestForeignWriterHoldNeverTakesPeersEmergency(t *testing.T) {
	_, client, clk, first := oldRotatorSecret(t, LayoutCertManager)
	bad := first.ca
	ctx := context.Background()
	// a runs one check at a time: between them it is paused.
	a := attackAuthority(t, client, clk, "peer-emergency-a", func(c *Config) { c.Adopt = LayoutCertManager })
	require.NoError(t, a.RunOnce(ctx))
	require.NoError(t, a.Leaf().CheckSignatureFrom(bad.Cert), "a signs with the adopted CA")
	b := runAdopting(t, client, clk, "peer-emergency-b", LayoutCertManager, nil)
	waitFor(t, "b's leaf", func() bool { return b.Leaf() != nil })
	waitWaiters(t, clk, 1)

	s := getSecret(t, client).DeepCopy()
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[CompromisedCAAnnotation] = Fingerprint(bad.Cert)
	_, err := client.CoreV1().Secrets("ns").Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	for steps := 0; ; steps++ {
		require.Less(t, steps, 60, "b's emergency did not leave one CA in tls.crt and ca.crt within ten minutes")
		clk.Step(10 * time.Second)
		waitWaiters(t, clk, 1)
		s := getSecret(t, client)
		if string(s.Data["tls.crt"]) == string(s.Data["ca.crt"]) && string(s.Data["tls.crt"]) != string(bad.CertPEM) {
			break
		}
	}
	require.NoError(t, a.RunOnce(ctx), "a wakes")
	st := a.Status()
	require.Empty(t, st.ForeignWriter, "a peer's emergency is not another writer's rewrite")
	require.Error(t, a.Leaf().CheckSignatureFrom(bad.Cert), "a serves a leaf of the compromised CA")
	require.False(t, caInBundle(t, a.CurrentCABundleContent(), &pki.Issued{Cert: bad.Cert}), "a publishes the compromised CA")
}
