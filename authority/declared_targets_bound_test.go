package authority

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// manyTargets is a TargetObserver standing for n caBundle targets that
// always holds every CA, as a cabundle.Publisher for many CRDs' conversion
// webhooks (one target per CRD) does once it has published.
type manyTargets struct{ n int }

func (manyTargets) Name() string                    { return "many" }
func (manyTargets) Observed(*x509.Certificate) bool { return true }
func (m manyTargets) Targets() []string {
	out := make([]string, m.n)
	for i := range out {
		out[i] = fmt.Sprintf(`CustomResourceDefinition "crd%02d.example.com"`, i)
	}
	return out
}

// TestPublisherOfMoreTargetsThanTheBoundDoesNotRewriteTheSecret: one
// replica whose publisher stands for more targets than
// CABundleTargetsAnnotation keeps (maxDeclaredTargets; a publisher of the
// conversion webhooks of many CRDs). Before, each check added the targets
// the last one cut, then cut others: the Secret was rewritten at every
// check while nothing changed (a review: 11 writes without the clock
// moving). Now the list is filled once and the rest is reported.
func TestPublisherOfMoreTargetsThanTheBoundDoesNotRewriteTheSecret(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	a := attackAuthority(t, client, clk, "many", func(c *Config) { c.DisableReplicaAnnouncements = false })
	a.AddObserver(manyTargets{n: maxDeclaredTargets + 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
	for range 5 {
		clk.Step(time.Minute)
		settle(t, clk, 2, client, writes, 10, a)
	}
	before := writes.Load()
	for range 10 {
		clk.Step(time.Minute)
		settle(t, clk, 2, client, writes, 10, a)
	}
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	lines := len(strings.Split(s.Annotations[CABundleTargetsAnnotation], "\n"))
	assert.Zero(t, writes.Load()-before, "Secret writes in 10 settled minutes, nothing changing (declared: %d lines)", lines)
	assert.Equal(t, maxDeclaredTargets, lines, "the list is filled")
}

// TestDeclarationRenewedInTheFutureLapses: a
// declaration whose renewal time lies far in the future (a hand edit, a
// forged line, or a publisher whose clock was years ahead once, then
// removed from the configuration) must lapse like any other that nobody
// renews, at most targetLapse and the skew tolerance after it was first
// read. Otherwise every successor waits for a target nobody will ever
// cover, and every rotation ends in a forced, unsafe promotion.
func TestDeclarationRenewedInTheFutureLapses(t *testing.T) {
	client := fake.NewClientset()
	optimistic(client)
	writes := secretWrites(client)
	clk := clocktesting.NewFakeClock(testNow)
	// A one-day leaf: an 8-day CA; lapse 64h-8h-14h = 42h, tolerance 1h.
	a := attackAuthority(t, client, clk, "future", func(c *Config) {
		c.DisableReplicaAnnouncements = false
		c.Lifetime = 24 * time.Hour
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
	settle(t, clk, 2, client, writes, 10, a)
	editSecret(t, client, func(s *corev1.Secret) {
		s.Annotations[CABundleTargetsAnnotation] = `2099-01-01T00:00:00Z ValidatingWebhookConfiguration "gone"`
	})
	editedAt := clk.Now()
	for clk.Since(editedAt) < 48*time.Hour {
		clk.Step(time.Hour)
		settle(t, clk, 2, client, writes, 10, a)
	}
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, s.Annotations, CABundleTargetsAnnotation, "a declaration nobody renews, read %v ago (lapse 42h + 1h tolerance)", clk.Since(editedAt))
	// The next rotation: the successor must not wait for the target until
	// the signing CA's end forces it (unsafe).
	first := a.Status().Signing.Fingerprint
	for a.Status().Signing.Fingerprint == first {
		clk.Step(time.Hour)
		settle(t, clk, 2, client, writes, 10, a)
		require.Less(t, clk.Since(editedAt), 10*24*time.Hour, "no rotation")
	}
	assert.Zero(t, a.Status().UnsafeRotations, "the rotation after the declaration was read %v ago: %s", clk.Since(editedAt), recordedWhy(client))
}

func recordedWhy(client *fake.Clientset) string {
	s, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return s.Annotations[UnsafeRotationsAnnotation]
}
