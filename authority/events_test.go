package authority

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/certreport/certreporttest"
)

// TestIssuerRotationEvents: the self-signed and Authority Run loops send a
// Normal CertificateRotated Event for each renewed leaf (not for the first
// one), about the configured object; the Authority's default object is its
// CA Secret.
func TestIssuerRotationEvents(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	selfRec, authRec := certreporttest.NewRecorder(), certreporttest.NewRecorder()
	s, err := NewSelfSigned(SelfSignedConfig{Name: "events-self-signed", Lifetime: time.Hour, Clock: clk, EventRecorder: selfRec, EventObject: certreporttest.Pod})
	require.NoError(t, err)
	client := fake.NewClientset()
	quietWatch(client)
	a, err := New(Config{
		Name: "events-authority", Namespace: "ns", SecretName: "ca", Client: client, Hosts: []string{"webhook.ns.svc"},
		Lifetime: time.Hour, Clock: clk, DisableReplicaAnnouncements: true, EventRecorder: authRec,
	})
	require.NoError(t, err)
	runInBackground(t, s.Run)
	runInBackground(t, a.Run)
	waitFor(t, "the Authority's first leaf", func() bool { return a.Leaf() != nil })
	assert.Empty(t, certreporttest.Drain(selfRec), "the first leaf is not a rotation")
	assert.Empty(t, certreporttest.Drain(authRec), "the first leaf is not a rotation")

	oldSelf, oldAuth := s.Leaf(), a.Leaf()
	selfBefore, authBefore := certmetricstest.Rotations(t, s.Name()), certmetricstest.Rotations(t, a.Name())
	// Both leaves are due; a loop that computed its timer just before the
	// jump wakes by the next steps.
	clk.SetTime(s.RenewAt())
	for i := 0; s.Leaf().Equal(oldSelf) || a.Leaf().Equal(oldAuth); i++ {
		require.Less(t, i, 120, "the leaves were not renewed within two simulated hours")
		waitWaiters(t, clk, 2)
		clk.Step(time.Minute)
	}

	for _, tc := range []struct {
		rec       *events.FakeRecorder
		rotations float64
		serial    string
		about     string
	}{
		{selfRec, certmetricstest.Rotations(t, s.Name()) - selfBefore, serial(s.Leaf()), "{kind=Pod,apiVersion=v1}"},
		{authRec, certmetricstest.Rotations(t, a.Name()) - authBefore, serial(a.Leaf()), "{kind=Secret,apiVersion=v1}"},
	} {
		got := certreporttest.Drain(tc.rec)
		require.NotEmpty(t, got)
		assert.Len(t, got, int(tc.rotations), "one Event per rotation: %q", got)
		for _, e := range got {
			assert.True(t, strings.HasPrefix(e, "Normal "+dynamiccert.ReasonCertificateRotated+" Rotate "), e)
			assert.True(t, strings.HasSuffix(e, tc.about), e)
		}
		assert.Contains(t, got[len(got)-1], tc.serial, "the Event names the new certificate")
	}
}
