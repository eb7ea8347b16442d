package authority_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
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

	for {
		s := w.secret()
		s.Data, s.Annotations = backup.Data, backup.Annotations
		_, err := w.client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			require.NoError(t, err)
			break
		}
	}
	restored := w.clk.Now()
	done := func() bool {
		s := w.secret()
		signing, err := pki.ParseCABundle(s.Data["tls.crt"])
		if err != nil || authority.Fingerprint(signing[0]) == fp || holds(s.Data[dynamiccert.SecretCAKey], fp) || holds(w.published(), fp) {
			return false
		}
		for _, a := range w.replicas {
			leaf := a.Leaf()
			if leaf == nil || holds(a.CurrentCABundleContent(), fp) || authority.Fingerprint(signing[0]) != authority.Fingerprint(leafCA(t, a)) {
				return false
			}
		}
		return true
	}
	for !done() {
		s := w.secret()
		require.Less(t, w.clk.Since(restored), 15*time.Minute, "the compromised CA restored from a backup is still in use: tls.crt holds it %v, ca.crt holds it %v, published %v, annotations %v",
			holds(s.Data["tls.crt"], fp), holds(s.Data[dynamiccert.SecretCAKey], fp), holds(w.published(), fp), s.Annotations)
		w.step(time.Second)
	}
	require.Contains(t, w.secret().Annotations["evercert.io/compromised-dropped-successors"], fp, "the Secret records the CA it keeps out")
	require.Zero(t, w.failed.Load(), "failed handshakes of a client following the caBundle")
}
