package authority

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
)

// TestProvidersRefuseBadHosts: NewSelfSigned and New refuse a
// host that is not a DNS name, a wildcard or an IP, naming the field, its
// index and the value. Before, each was accepted and made into a DNS SAN
// ("host:443", " b", "10.0.0.1/32") that no client verifies.
func TestProvidersRefuseBadHosts(t *testing.T) {
	for _, bad := range []string{"host:443", "https://host", " b", "10.0.0.1/32"} {
		_, err := NewSelfSigned(SelfSignedConfig{Hosts: []string{"localhost", bad}})
		if assert.Error(t, err, "self-signed %q", bad) {
			assert.Contains(t, err.Error(), `Hosts[1]: "`+bad+`"`)
		}
		_, err = New(Config{Namespace: "ns", SecretName: "ca", Client: fake.NewClientset(), Hosts: []string{bad}})
		if assert.Error(t, err, "authority %q", bad) {
			assert.Contains(t, err.Error(), `authority ns/ca: Hosts[0]: "`+bad+`"`)
		}
	}
	_, err := New(Config{Namespace: "ns", SecretName: "ca", Client: fake.NewClientset(), Hosts: []string{"*.webhook.ns.svc", "webhook.ns.svc", "10.0.0.1"}})
	assert.NoError(t, err)
}

// TestLifetimeLimit: a leaf Lifetime whose default CA lifetime (8 × for an
// Authority, 3 × for SelfSigned) would not fit is refused with the field
// and the limit named, as is a Lifetime or CALifetime beyond dynamiccert.MaxLifetime.
// Before, a 40-year Authority leaf overflowed 8 × Lifetime into a negative
// CA lifetime and failed with "lifetimes must be positive".
func TestLifetimeLimit(t *testing.T) {
	const year = 365 * 24 * time.Hour
	authority := func(lifetime, caLifetime time.Duration) error {
		_, err := New(Config{
			Namespace: "ns", SecretName: "ca", Client: fake.NewClientset(), Hosts: []string{"localhost"},
			Lifetime: lifetime, CALifetime: caLifetime, Clock: clocktesting.NewFakeClock(testNow),
		})
		return err
	}
	err := authority(40*year, 0)
	require.Error(t, err)
	assert.Equal(t, "authority ns/ca: the Lifetime 350400h0m0s must be at most 219000h0m0s while CALifetime is left to its default, 8 × Lifetime, which must be at most 1752000h0m0s (MaxLifetime); set CALifetime to allow a longer Lifetime", err.Error())
	assert.NoError(t, authority(25*year, 0), "the longest Lifetime with the default CALifetime")
	assert.NoError(t, authority(40*year, 100*year), "a longer Lifetime with CALifetime set")
	assert.ErrorContains(t, authority(40*year, 250*year), "CALifetime 2190000h0m0s must be at most 1752000h0m0s (MaxLifetime)")
	assert.ErrorContains(t, authority(201*year, 0), "Lifetime 1760760h0m0s must be at most 1752000h0m0s (MaxLifetime)")

	_, err = NewSelfSigned(SelfSignedConfig{Lifetime: 100 * year, Clock: clocktesting.NewFakeClock(testNow)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Lifetime 876000h0m0s must be at most 584000h0m0s while CALifetime is left to its default, 3 × Lifetime")
}

// TestDefaultSelfSignedHostsAreValid: the default hosts pass the check
// every configured host passes (dynamiccert.ValidateHosts).
func TestDefaultSelfSignedHostsAreValid(t *testing.T) {
	assert.NoError(t, dynamiccert.ValidateHosts("Hosts", DefaultSelfSignedHosts))
}
