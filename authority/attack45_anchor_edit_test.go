package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAttack45AnchorCAEditRetiresTheAnchor (attack on stop 45's anchor):
// docs/migrating.md and AnchorCAAnnotation's comment promise that the
// anchor (the CA adopted when the migration began, O1) stays in ca.crt
// until it expires, and that editing evercert.io/anchor-ca "only keeps
// the CA it names longer (for the replicas that read it; the others keep
// the anchor they know)". a adopts O1 (the fleet's anchor), the old
// rotator answers with O2 and a holds. The operator then edits the
// annotation (to the fingerprint of the signing CA O2, to garbage, or
// removes it) and the rolling update's next pod b starts on that
// rewrite. b does not know O1 as the anchor: trustRecorded takes O1 back
// only for a's leaf, with a retirement (retire-after) a leaf lifetime
// and a check interval later. retire() on every replica (a, which knows
// O1 as its anchor, included) drops it once a's leaf of O1 is renewed
// from O2. Without the edit b takes O1 for the anchor and it stays.
func TestAttack45AnchorCAEditRetiresTheAnchor(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(anns map[string]string, signing string)
	}{
		{"no edit", nil},
		{"signing CA", func(anns map[string]string, signing string) { anns[AnchorCAAnnotation] = signing }},
		{"garbage", func(anns map[string]string, _ string) { anns[AnchorCAAnnotation] = "garbage" }},
		{"removed", func(anns map[string]string, _ string) { delete(anns, AnchorCAAnnotation) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
			announced := func(c *Config) { c.DisableReplicaAnnouncements = false }
			a, _ := startStoppable(t, client, clk, "a45-a", LayoutCertController, announced)
			waitFor(t, "a's adoption of O1", func() bool {
				s := getSecret(t, client)
				_, cc := s.Data["ca.key"]
				return !cc && a.Leaf() != nil && a.Leaf().CheckSignatureFrom(o1.ca.Cert) == nil
			})
			require.Equal(t, Fingerprint(o1.ca.Cert), getSecret(t, client).Annotations[AnchorCAAnnotation], "the fleet's anchor recorded")
			waitWaiters(t, clk, 1)
			old.rewrite() // O2
			o2 := old.latest
			waitFor(t, "a's hold", func() bool { return a.Status().ForeignWriter != "" })
			if tc.edit != nil {
				s := getSecret(t, client).DeepCopy()
				tc.edit(s.Annotations, Fingerprint(o2.ca.Cert))
				_, err := client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
				require.NoError(t, err)
			}
			b, _ := startStoppable(t, client, clk, "a45-b", LayoutCertController, announced)
			waitFor(t, "b's adoption of O2, a following it", func() bool {
				s := getSecret(t, client)
				return string(s.Data["tls.crt"]) == string(o2.ca.CertPEM) && b.Leaf() != nil && a.Status().ForeignWriter == "" && !a.Status().Stalled
			})
			adopted := getSecret(t, client)
			t.Logf("after b's start: anchor-ca=%q retire-after=%q (O1=%s)", adopted.Annotations[AnchorCAAnnotation], adopted.Annotations[RetireAfterAnnotation], Fingerprint(o1.ca.Cert))
			// The old rotator is gone (the rollout's end): a leaf lifetime
			// and more passes; a renews its leaf from O2.
			for range 180 {
				clk.Step(time.Minute)
				time.Sleep(10 * time.Millisecond)
			}
			s := getSecret(t, client)
			t.Logf("anchor-ca=%q retire-after=%q ca.crt holds %d CAs", s.Annotations[AnchorCAAnnotation], s.Annotations[RetireAfterAnnotation], countCerts(t, s.Data["ca.crt"]))
			require.True(t, caInBundle(t, s.Data["ca.crt"], o1.ca),
				"O1, the CA adopted when the migration began, left ca.crt after a hand edit of %s (docs/migrating.md: it stays until it expires; editing only keeps a CA longer)", AnchorCAAnnotation)
			require.True(t, caInBundle(t, a.CurrentCABundleContent(), o1.ca), "a, which knows O1 as the anchor, dropped it")
		})
	}
}

// TestAttack45CompromisedAnchorLeavesDuringOverlap: the anchor (O1) is
// marked compromised while the old rotator still rewrites and a rollout's
// next pod starts on its rewrite; the anchor's "kept until it expires"
// must not keep a compromised CA: it leaves ca.crt and every bundle.
func TestAttack45CompromisedAnchorLeavesDuringOverlap(t *testing.T) {
	old, client, clk, o1 := oldRotatorSecret(t, LayoutCertController)
	announced := func(c *Config) { c.DisableReplicaAnnouncements = false }
	a, _ := startStoppable(t, client, clk, "a45c-a", LayoutCertController, announced)
	waitFor(t, "a's adoption of O1", func() bool {
		_, cc := getSecret(t, client).Data["ca.key"]
		return !cc && a.Leaf() != nil && a.Leaf().CheckSignatureFrom(o1.ca.Cert) == nil
	})
	waitWaiters(t, clk, 1)
	old.rewrite() // O2
	waitFor(t, "a's hold", func() bool { return a.Status().ForeignWriter != "" })
	s := getSecret(t, client).DeepCopy()
	s.Annotations[CompromisedCAAnnotation] = Fingerprint(o1.ca.Cert)
	_, err := client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
	b, _ := startStoppable(t, client, clk, "a45c-b", LayoutCertController, announced)
	for range 120 {
		clk.Step(30 * time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	old.rewrite() // O3: the old rotator answers once more, annotations kept
	for range 240 {
		clk.Step(30 * time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	s = getSecret(t, client)
	t.Logf("anchor-ca=%q other-writer-cas=%q ca.crt holds %d CAs", s.Annotations[AnchorCAAnnotation], s.Annotations[OtherWriterCAsAnnotation], countCerts(t, s.Data["ca.crt"]))
	require.False(t, caInBundle(t, s.Data["ca.crt"], o1.ca), "the compromised anchor is still in ca.crt")
	for _, r := range []*Authority{a, b} {
		require.False(t, caInBundle(t, r.CurrentCABundleContent(), o1.ca), "%s still publishes the compromised anchor", r.Name())
		require.Error(t, r.Leaf().CheckSignatureFrom(o1.ca.Cert), "%s serves a leaf of the compromised anchor", r.Name())
	}
}
