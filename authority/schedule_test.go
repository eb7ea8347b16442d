package authority

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestSuccessiveCAsHaveDistinctNames runs a self-signed provider through a
// CA rotation: each CA is named "<provider>-ca@<unix seconds it was made>",
// so the successor's name differs from its predecessor's, and the leaves
// name their CA as issuer.
func TestSuccessiveCAsHaveDistinctNames(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	s, err := NewSelfSigned(SelfSignedConfig{Name: "ca-names", Lifetime: time.Hour, Clock: clk})
	require.NoError(t, err)
	first := s.Status().Signing
	assert.Equal(t, fmt.Sprintf("ca-names-ca@%d", testNow.Unix()), first.CommonName)
	assert.Equal(t, first.CommonName, s.Leaf().Issuer.CommonName)

	runInBackground(t, s.Run)
	for i := 0; s.Status().Signing.Serial == first.Serial; i++ {
		require.Less(t, i, 300, "no CA rotation within five simulated hours")
		waitWaiters(t, clk, 1)
		clk.Step(time.Minute)
	}
	waitFor(t, "a leaf of the new CA", func() bool { return s.Leaf().Issuer.CommonName != first.CommonName })
	second := s.Status().Signing
	assert.Regexp(t, `^ca-names-ca@\d+$`, second.CommonName)
	assert.NotEqual(t, first.CommonName, second.CommonName)
	// The successor was made when it was published, CARenewBefore ahead of
	// the first CA's end, on the injected clock.
	made := second.NotBefore.Add(s.sched.backdate())
	assert.Equal(t, fmt.Sprintf("ca-names-ca@%d", made.Unix()), second.CommonName)
	assert.Equal(t, second.CommonName, s.Leaf().Issuer.CommonName)
}
