package authority_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// restoreBackup puts backup's data and annotations back into the CA
// Secret, as a restore from a backup does.
func restoreBackup(w *emergencyWorld, backup *corev1.Secret) {
	w.t.Helper()
	for {
		s := w.secret()
		s.Data, s.Annotations = backup.Data, backup.Annotations
		_, err := w.client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			require.NoError(w.t, err)
			return
		}
	}
}

// restoreAnnotate sets one annotation of the CA Secret, as an operator
// does.
func restoreAnnotate(w *emergencyWorld, k, v string) {
	w.t.Helper()
	for {
		s := w.secret()
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
		_, err := w.client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			require.NoError(w.t, err)
			return
		}
	}
}

func restoreFingerprint(t *testing.T, pem []byte) string {
	t.Helper()
	if len(pem) == 0 {
		return ""
	}
	cas, err := pki.ParseCABundle(pem)
	require.NoError(t, err)
	return authority.Fingerprint(cas[0])
}

// TestBackupWithPendingSuccessorKeepsTheDroppedSuccessorOut: the
// backup is from before the mark while a successor was pending (a rotate
// request, or a scheduled rotation in its delay). The emergency dropped
// that successor: its key sat where the compromised CA's did (next.key
// beside tls.key), so it must never sign, and the Secret recorded it in
// evercert.io/compromised-dropped-successors. The backup takes that record
// away with the mark. The replicas remember the marked CA (known), but not
// the dropped successor: the restored Secret's successor is taken for an
// ordinary one, stays published, and signs once its delay has passed.
func TestBackupWithPendingSuccessorKeepsTheDroppedSuccessorOut(t *testing.T) {
	t.Parallel() // see guard
	w := newEmergencyWorld(t)
	restoreAnnotate(w, authority.RotateRequestedAnnotation, w.clk.Now().UTC().Format(time.RFC3339))
	for restoreFingerprint(t, w.secret().Data[authority.NextCertKey]) == "" {
		w.step(time.Second)
	}
	backup := w.secret().DeepCopy()
	compromised := restoreFingerprint(t, backup.Data["tls.crt"])
	pending := restoreFingerprint(t, backup.Data[authority.NextCertKey])
	w.emergency()
	require.Contains(t, w.secret().Annotations["evercert.io/compromised-dropped-successors"], pending,
		"the emergency dropped the successor that was pending at the mark")

	restoreBackup(w, backup)
	restored := w.clk.Now()
	// Long enough for the default delay (CALifetime 8h, CARenewBefore
	// 2h40m, RenewBefore 20m: 35m) to pass on every replica's clock.
	for w.clk.Since(restored) < 50*time.Minute {
		w.step(5 * time.Second)
		s := w.secret()
		signing := restoreFingerprint(t, s.Data["tls.crt"])
		require.NotEqual(t, compromised, signing, "the compromised CA signs again %v after the restore", w.clk.Since(restored))
		require.NotEqual(t, pending, signing, "the successor dropped in the emergency (its key sat beside the compromised one) signs %v after a backup from before the mark was restored; annotations %v",
			w.clk.Since(restored), s.Annotations)
		for n, a := range w.replicas {
			require.NotEqual(t, pending, authority.Fingerprint(leafCA(t, a)), "replica %d serves a leaf of the dropped successor", n)
		}
	}
	s := w.secret()
	require.False(t, holds(s.Data[dynamiccert.SecretCAKey], pending) || restoreFingerprint(t, s.Data[authority.NextCertKey]) == pending,
		"the dropped successor is still in the Secret (ca.crt or next.crt) 50m after the restore; annotations %v", s.Annotations)
}

// TestBackupFromBeforeTheFirstMarkDuringASecondEmergency: CA C was
// marked compromised and replaced by E; then E is marked too, and its
// emergency successor F waits for the caBundle publisher (its writes
// fail). A backup from before the first mark is restored now: C signs
// in it, no mark. Every replica knows C compromised (known), so this is a
// rollback, yet the CA this process had signing (E) is compromised too,
// so restore writes nothing back for the signing slot (keep(E) is false)
// and C stays the signing CA of the Secret: a CA every replica knows
// compromised, back in ca.crt and signing, with no mark to run an
// emergency on.
func TestBackupFromBeforeTheFirstMarkDuringASecondEmergency(t *testing.T) {
	t.Parallel() // see guard
	var webhookDown atomic.Bool
	w := newEmergencyWorldWith(t, func(c *fake.Clientset) {
		for _, verb := range []string{"update", "patch", "create"} {
			c.PrependReactor(verb, "validatingwebhookconfigurations", func(clienttesting.Action) (bool, runtime.Object, error) {
				if webhookDown.Load() {
					return true, nil, apierrors.NewInternalError(errors.New("webhook writes fail"))
				}
				return false, nil, nil
			})
		}
	})
	backup := w.secret().DeepCopy()
	first := restoreFingerprint(t, backup.Data["tls.crt"])
	w.emergency()
	second := restoreFingerprint(t, w.secret().Data["tls.crt"])
	require.NotEqual(t, first, second)

	webhookDown.Store(true)
	w.markCompromised(second)
	for restoreFingerprint(t, w.secret().Data[authority.NextCertKey]) == "" {
		w.clk.Step(time.Second)
		w.settle()
	}
	for range 5 {
		w.clk.Step(time.Second)
		w.settle()
	}
	require.Equal(t, second, restoreFingerprint(t, w.secret().Data["tls.crt"]), "the second emergency waits for the publisher")

	restoreBackup(w, backup)
	restored := w.clk.Now()
	for w.clk.Since(restored) < 5*time.Minute {
		w.clk.Step(time.Second)
		w.settle() // no follower: the publisher is down
	}
	s := w.secret()
	// Who signed each replica's leaf, and whether its own bundle holds it.
	var leaves []string
	for _, a := range w.replicas {
		leaves = append(leaves, restoreLeafIssuer(t, a))
		require.Contains(t, restoreLeafIssuer(t, a), "in its bundle: true", "5m after the restore, a replica serves a leaf its own bundle does not hold: %v; annotations %v", leaves, s.Annotations)
		require.NotEqual(t, first, authority.Fingerprint(leafCA(t, a)), "%s serves a leaf of the CA known compromised since the first mark", a.Name())
		require.Equal(t, authority.PhaseEmergency, a.Status().Phase, "%s says the restored CA is being replaced", a.Name())
	}
	require.Contains(t, s.Annotations["evercert.io/compromised-dropped-successors"], first, "the Secret records the restored CA as compromised again")
	// The emergency waits for the publisher, as the second one did; once
	// it is back, the CA known compromised leaves tls.crt and ca.crt.
	webhookDown.Store(false)
	back := w.clk.Now()
	for {
		s = w.secret()
		if restoreFingerprint(t, s.Data["tls.crt"]) != first && !holds(s.Data[dynamiccert.SecretCAKey], first) && !holds(w.published(), first) {
			break
		}
		require.Less(t, w.clk.Since(back), 15*time.Minute,
			"the CA every replica knows compromised since the first mark (%s; the second: %s) is still in use after the restore: signing %v, ca.crt holds it: %v, published: %v; next.crt: %s; leaves %v; annotations %v",
			first, second, restoreFingerprint(t, s.Data["tls.crt"]) == first, holds(s.Data[dynamiccert.SecretCAKey], first), holds(w.published(), first), restoreFingerprint(t, s.Data[authority.NextCertKey]), leaves, s.Annotations)
		w.step(time.Second)
	}
}

// restoreLeafIssuer names the issuer of a's leaf and says whether a's own
// bundle holds the CA that signed it.
func restoreLeafIssuer(t *testing.T, a *authority.Authority) string {
	t.Helper()
	leaf := a.Leaf()
	if leaf == nil {
		return "no leaf"
	}
	inBundle := false
	own, err := pki.ParseCABundle(a.CurrentCABundleContent())
	require.NoError(t, err)
	for _, c := range own {
		if leaf.CheckSignatureFrom(c) == nil {
			inBundle = true
		}
	}
	return fmt.Sprintf("%s (issuer %q, in its bundle: %v)", a.Name(), leaf.Issuer.CommonName, inBundle)
}
