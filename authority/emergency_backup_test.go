package authority_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
)

// TestCompromisedCABackupFromBeforeTheMarkIsRotatedAgain restores, after an
// emergency, a backup of the CA Secret taken before the mark: its data and
// its annotations, so the Secret again names the compromised CA as the
// signing one and holds no mark. A replica that read the mark never signs
// with that CA again, so the emergency runs again: the CA leaves tls.crt,
// ca.crt, the published caBundle and every replica's bundle, and the
// Secret says why (the mark is back).
func TestCompromisedCABackupFromBeforeTheMarkIsRotatedAgain(t *testing.T) {
	t.Run("replicas that read the mark", func(t *testing.T) { testBackupFromBeforeTheMark(t, false) })
	// Every replica restarted after the emergency was over: none read the
	// mark while it was acted on, only the Secret's record of it.
	t.Run("replicas started after the emergency", func(t *testing.T) { testBackupFromBeforeTheMark(t, true) })
}

func testBackupFromBeforeTheMark(t *testing.T, restart bool) {
	w := newEmergencyWorld(t)
	backup := w.secret().DeepCopy()
	cas, err := pki.ParseCABundle(backup.Data["tls.crt"])
	require.NoError(t, err)
	fp := authority.Fingerprint(cas[0])
	w.emergency()
	if restart {
		for r := range w.replicas {
			w.restart(r)
		}
		for range 5 {
			w.step(time.Second)
		}
	}

	w.editSecret(func(s *corev1.Secret) { s.Data, s.Annotations = backup.Data, backup.Annotations })
	w.untilGone(fp, "the compromised CA restored from a backup")
	require.Contains(t, w.secret().Annotations["evercert.io/compromised-dropped-successors"], fp, "the Secret records the CA it keeps out")
}
