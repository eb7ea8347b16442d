package authority

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// editSecret applies edit to the CA Secret as a second writer would.
func editSecret(t *testing.T, client *fake.Clientset, edit func(*corev1.Secret)) {
	t.Helper()
	secrets := client.CoreV1().Secrets("ns")
	s, err := secrets.Get(context.Background(), "ca", metav1.GetOptions{})
	require.NoError(t, err)
	edit(s)
	_, err = secrets.Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// runToSuccessor steps clk a minute at a time until a has published a
// successor, and returns it.
func runToSuccessor(t *testing.T, a *Authority, clk *clocktesting.FakeClock) *SuccessorStatus {
	t.Helper()
	for a.Status().Successor == nil {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
	}
	return a.Status().Successor
}

// TestAttackSecondWriterDuringRotation: while a successor waits, a second
// writer edits the Secret: it deletes next.crt and next.key, or strips or
// garbles the publication annotation. The rotation must go on: the
// successor is neither lost nor replaced, signs no earlier than its
// minimum delay (counted from when this replica first saw it, not restarted
// and not cut short), and no client holding the bundle from the
// publication loses trust through the old CA's expiry.
func TestAttackSecondWriterDuringRotation(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*corev1.Secret)
	}{
		{"deletes next.crt and next.key", func(s *corev1.Secret) {
			delete(s.Data, NextCertKey)
			delete(s.Data, NextKeyKey)
		}},
		{"deletes next.crt, leaves the annotation", func(s *corev1.Secret) {
			delete(s.Data, NextCertKey)
		}},
		{"strips the annotation", func(s *corev1.Secret) {
			delete(s.Annotations, NextSinceAnnotation)
		}},
		{"garbles the annotation", func(s *corev1.Secret) {
			s.Annotations[NextSinceAnnotation] = "yesterday"
		}},
		{"moves the annotation a day back", func(s *corev1.Secret) {
			s.Annotations[NextSinceAnnotation] = testNow.Add(-24 * time.Hour).Format(time.RFC3339)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			clk := clocktesting.NewFakeClock(testNow)
			a := attackAuthority(t, client, clk, "attack-writer", nil)
			runInBackground(t, a.Run)
			waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
			waitBlocked(t, clk)
			succ := runToSuccessor(t, a, clk)
			published := a.CurrentCABundleContent()
			old := a.Status().Signing

			editSecret(t, client, tc.edit)
			clk.Step(time.Second) // let the loop notice, and settle
			waitBlocked(t, clk)
			for a.Status().Signing.Serial == old.Serial {
				require.True(t, clk.Now().Before(old.NotAfter), "the successor never signed before the old CA expired; last error: %v", a.LastError())
				if st := a.Status().Successor; st != nil {
					require.Equal(t, succ.Serial, st.Serial, "the successor was replaced")
				}
				clk.Step(time.Minute)
				waitBlocked(t, clk)
				require.NoError(t, handshakeWith(t, a, published, clk.Now))
			}
			assert.Equal(t, succ.Serial, a.Status().Signing.Serial)
			assert.False(t, clk.Now().Before(succ.SignsNoEarlierThan), "signed before the minimum delay")
			assert.NoError(t, a.LastError())
			assert.Zero(t, a.Status().UnsafeRotations)
			require.NoError(t, handshakeWith(t, a, published, clk.Now))
		})
	}
}
