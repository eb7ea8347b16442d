package loopback

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/dynamiccert"
)

func TestOptionsDefaults(t *testing.T) {
	var o CertificateConfig
	require.NoError(t, o.complete())
	assert.Equal(t, 24*time.Hour, o.Validity)
	assert.Equal(t, 8*time.Hour, o.RenewBefore, "renew at 2/3 of the validity")
	assert.Equal(t, dynamiccert.ECDSAP256, o.KeyType)
	assert.Equal(t, clock.RealClock{}, o.Clock)
	assert.Equal(t, 144*time.Minute, o.Grace, "grace is a tenth of the validity")

	o = CertificateConfig{Validity: time.Hour, RenewBefore: 10 * time.Minute}
	require.NoError(t, o.complete())
	assert.Equal(t, 5*time.Minute, o.Grace, "grace is capped at half of renew-before")
}

func TestOptionsValidation(t *testing.T) {
	for name, o := range map[string]CertificateConfig{
		"validity too short":       {Validity: time.Millisecond},
		"renew-before >= validity": {Validity: time.Hour, RenewBefore: time.Hour},
		"negative renew-before":    {RenewBefore: -time.Second},
		"negative grace":           {Grace: -time.Second},
		"unknown key type":         {KeyType: "dsa"},
		"negative validity":        {Validity: -time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewCertificate(o)
			assert.Error(t, err)
		})
	}
}
