package dynamiccert_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// TestStaticCertKey: the config is validated naming the field, the content
// is copied, and the parsed pair is the one served.
func TestStaticCertKey(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "static-ca", Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "static.test", DNSNames: []string{"static.test"}, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)

	_, err = dynamiccert.NewStaticCertKey(dynamiccert.StaticCertKeyConfig{Cert: leaf.CertPEM, Key: leaf.KeyPEM})
	require.ErrorContains(t, err, "StaticCertKeyConfig.Name")
	_, err = dynamiccert.NewStaticCertKey(dynamiccert.StaticCertKeyConfig{Name: "bad", Cert: leaf.CertPEM, Key: ca.KeyPEM})
	require.ErrorContains(t, err, `"bad"`, "a mismatched key names the provider")

	cert := append([]byte(nil), leaf.CertPEM...)
	p, err := dynamiccert.NewStaticCertKey(dynamiccert.StaticCertKeyConfig{Name: "static", Cert: cert, Key: leaf.KeyPEM, SNINames: []string{"alias.test"}})
	require.NoError(t, err)
	cert[0] = 'X' // the caller's slice is not the provider's
	c, k, parsed := p.CurrentParsedCertKeyContent()
	assert.Equal(t, leaf.CertPEM, c)
	assert.Equal(t, leaf.KeyPEM, k)
	require.NotNil(t, parsed)
	assert.True(t, parsed.Leaf.Equal(leaf.Cert))
	assert.Equal(t, []string{"alias.test"}, p.SNINames())
	assert.Equal(t, "static", p.Name())
}
