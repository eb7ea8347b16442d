package loopback_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/loopback"
)

func TestHealthCheck(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now())
	c, err := loopback.NewCertificate(loopback.CertificateConfig{Clock: fc, Validity: time.Hour})
	require.NoError(t, err)
	grace := c.Config().Grace
	require.Equal(t, 6*time.Minute, grace)
	check := c.HealthCheck()
	assert.Equal(t, "loopback-serving-certificate", check.Name())
	assert.NoError(t, check.Check(nil))

	// Due for renewal, within grace: still healthy.
	fc.SetTime(c.RenewAt().Add(grace))
	assert.NoError(t, check.Check(nil))

	// Past RenewAt+Grace without rotation: stalled.
	fc.SetTime(c.RenewAt().Add(grace + time.Second))
	err = check.Check(nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "stalled")
	assert.Contains(t, err.Error(), "of validity left")

	// Rotation resumes: healthy again.
	require.NoError(t, c.RunOnce(context.Background()))
	assert.NoError(t, check.Check(nil))

	// Expired.
	fc.SetTime(c.Leaf().NotAfter.Add(time.Minute))
	err = check.Check(nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "expired 1m0s ago")
	require.NoError(t, c.RunOnce(context.Background()))
	assert.NoError(t, check.Check(nil))
}
