package authority

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/pki"
)

// startStoppable is runAdopting with a stop: stop cancels Run and waits
// for it (a graceful stop deletes the Lease), as a pod's restart does.
func startStoppable(t *testing.T, client *fake.Clientset, clk *clocktesting.FakeClock, name string, layout SecretLayout, mutate func(*Config)) (*Authority, func()) {
	t.Helper()
	a := attackAuthority(t, client, clk, name, func(c *Config) {
		c.Adopt = layout
		if mutate != nil {
			mutate(c)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx, 1) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return a, stop
}

// TestReview43bAnchorSpreadByOtherWriterCAs (review 43b, finding 1): the
// CA the replicas signed with when the overlap began (first, adopted from
// cert-controller) "stays until it expires, as after any adoption (a
// replica cut off since then renews from it, whatever the length of the
// cut)" (docs/migrating.md). Every write in an adopted layout lists first
// in evercert.io/other-writer-cas (it is in ca.crt and in the writer's
// episode), so a replica that restarts after the first episode learns it
// as "the other writer's" with no anchor to protect it: the next episode's
// trim (cert-controller answers each adoption) leaves it out or retires it
// (retireKept), and retire() on every replica drops it.
func TestReview43bAnchorSpreadByOtherWriterCAs(t *testing.T) {
	old, client, clk, first := oldRotatorSecret(t, LayoutCertController)
	announced := func(c *Config) { c.DisableReplicaAnnouncements = false }
	a, stopA := startStoppable(t, client, clk, "r43b-a", LayoutCertController, announced)
	b, stopB := startStoppable(t, client, clk, "r43b-b", LayoutCertController, announced)
	waitFor(t, "both replicas' leaves of the first CA", func() bool {
		return a.Leaf() != nil && b.Leaf() != nil && a.Leaf().CheckSignatureFrom(first.ca.Cert) == nil && b.Leaf().CheckSignatureFrom(first.ca.Cert) == nil
	})
	overlapThenQuiet(t, old, client, clk, 3, a, b)
	s := getSecret(t, client)
	require.True(t, caInBundle(t, s.Data["ca.crt"], first.ca), "first stays after the first episode")
	t.Logf("after episode 1: other-writer-cas=%q (first=%s)", s.Annotations[OtherWriterCAsAnnotation], Fingerprint(first.ca.Cert)[:12])

	// A rolling restart of evercert's own pods (a config change): both
	// restart, one at a time.
	stopA()
	c, _ := startStoppable(t, client, clk, "r43b-c", LayoutCertController, announced)
	waitFor(t, "c's leaf", func() bool { return c.Leaf() != nil && !c.Status().Stalled })
	stopB()
	d, _ := startStoppable(t, client, clk, "r43b-d", LayoutCertController, announced)
	waitFor(t, "d's leaf", func() bool { return d.Leaf() != nil && !d.Status().Stalled })

	// The old rotator answers once more (a second episode).
	overlapThenQuiet(t, old, client, clk, 2, c, d)
	for range 150 {
		clk.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	s = getSecret(t, client)
	t.Logf("after episode 2 + 150m: retire-after=%q ca.crt holds %d CAs", s.Annotations[RetireAfterAnnotation], countCerts(t, s.Data["ca.crt"]))
	require.False(t, strings.Contains(s.Annotations[RetireAfterAnnotation], Fingerprint(first.ca.Cert)), "the CA signed with when the overlap began got a retirement")
	require.True(t, caInBundle(t, s.Data["ca.crt"], first.ca), "the CA signed with when the overlap began (docs/migrating.md: stays until it expires) left ca.crt")
}

// TestReview43bHandEditRetiresAdoptedCAInPlainMigration (review 43b,
// finding 2): a plain migration, no overlap: docs/migrating.md promises
// the adopted CA stays in ca.crt until it expires. A hand edit of
// evercert.io/other-writer-cas that also names evercert's own successor
// (two entries: retireReplaced's "an overlap is known" gate) makes the
// rotation that replaces the adopted CA retire it a leaf lifetime later.
func TestReview43bHandEditRetiresAdoptedCAInPlainMigration(t *testing.T) {
	_, client, clk, first := oldRotatorSecret(t, LayoutCertController)
	announced := func(c *Config) { c.DisableReplicaAnnouncements = false }
	a, _ := startStoppable(t, client, clk, "r43b-p", LayoutCertController, announced)
	waitFor(t, "adoption", func() bool { return a.Leaf() != nil && a.Leaf().CheckSignatureFrom(first.ca.Cert) == nil })
	s := getSecret(t, client).DeepCopy()
	s.Annotations[RotateRequestedAnnotation] = clk.Now().UTC().Format(time.RFC3339)
	_, err := client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
	var nextFP string
	for steps := 0; nextFP == ""; steps++ {
		require.Less(t, steps, 60)
		clk.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
		if p := getSecret(t, client).Data["next.crt"]; len(p) > 0 {
			certs, err := pki.ParseCABundle(p)
			require.NoError(t, err)
			nextFP = Fingerprint(certs[0])
		}
	}
	s = getSecret(t, client).DeepCopy()
	s.Annotations[OtherWriterCAsAnnotation] = Fingerprint(first.ca.Cert) + "," + nextFP
	_, err = client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
	for range 300 {
		clk.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	s = getSecret(t, client)
	t.Logf("retire-after=%q ca.crt holds %d CAs", s.Annotations[RetireAfterAnnotation], countCerts(t, s.Data["ca.crt"]))
	require.NotEqual(t, string(first.ca.CertPEM), string(s.Data["tls.crt"]), "rotated away from the adopted CA")
	require.True(t, caInBundle(t, s.Data["ca.crt"], first.ca), "the adopted CA of a plain migration left ca.crt (docs/migrating.md: stays until it expires)")
}
