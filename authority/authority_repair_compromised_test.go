package authority

import (
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/evercert/evercert/internal/pki"
)

// TestRepairNeverWritesBackACompromisedCA (adversarial review of issue 27
// §3): a replica partitioned through a whole emergency still holds the
// compromised CA as its last state. When someone then breaks the Secret,
// the repair must not write that CA back, as signing CA, as successor or in
// ca.crt: the mark stays in the Secret and is honoured even when the
// replica never acted on it. Without the check, fill returned the
// compromised CA as the signing CA and the bundle holding it.
func TestRepairNeverWritesBackACompromisedCA(t *testing.T) {
	bad, err := pki.NewCA(pki.Request{CommonName: "compromised", Now: testNow, Lifetime: 8 * time.Hour})
	require.NoError(t, err)
	good, err := pki.NewCA(pki.Request{CommonName: "successor", Now: testNow, Lifetime: 8 * time.Hour})
	require.NoError(t, err)
	fp := Fingerprint(bad.Cert)
	secret := &corev1.Secret{Data: map[string][]byte{corev1.TLSCertKey: []byte("garbage")}}

	t.Run("signing", func(t *testing.T) {
		last := &caSet{signing: bad, bundle: []*x509.Certificate{bad.Cert}}
		broken := &brokenSecretError{st: &caSet{}, signing: errors.New("tls.crt: malformed PEM")}
		_, _, err := (&secretRepair{name: "r"}).fill(secret, broken, broken, last, fp)
		var unrepairable *unrepairableError
		require.ErrorAs(t, err, &unrepairable, "the compromised CA was written back as the signing CA")
		require.ErrorContains(t, err, "marked compromised")
	})
	t.Run("successor", func(t *testing.T) {
		last := &caSet{signing: good, next: bad, bundle: []*x509.Certificate{good.Cert, bad.Cert}}
		broken := &brokenSecretError{st: &caSet{signing: good}, next: errors.New("next.crt: malformed PEM")}
		_, _, err := (&secretRepair{name: "r"}).fill(secret, broken, broken, last, fp)
		require.ErrorContains(t, err, "marked compromised", "the compromised CA was written back as the successor")
	})
	t.Run("bundle", func(t *testing.T) {
		last := &caSet{signing: good, bundle: []*x509.Certificate{bad.Cert, good.Cert}}
		broken := &brokenSecretError{st: &caSet{signing: good}, bundle: errors.New("ca.crt: malformed PEM")}
		st, _, err := (&secretRepair{name: "r"}).fill(secret, broken, broken, last, fp)
		require.NoError(t, err)
		require.False(t, containsCert(st.bundle, bad.Cert), "the compromised CA was written back into ca.crt")
		require.True(t, containsCert(st.bundle, good.Cert))
	})
}
