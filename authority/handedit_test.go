package authority_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// editSecret changes the CA Secret as an operator's kubectl edit does: a
// read, a change, an Update carrying the resourceVersion read.
func (w *emergencyWorld) editSecret(edit func(*corev1.Secret)) {
	w.t.Helper()
	for {
		s := w.secret()
		edit(s)
		_, err := w.client.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			require.NoError(w.t, err)
			return
		}
	}
}

// signingCA is the CA in the Secret's tls.crt.
func (w *emergencyWorld) signingCA() *x509.Certificate {
	w.t.Helper()
	cas, err := pki.ParseCABundle(w.secret().Data[corev1.TLSCertKey])
	require.NoError(w.t, err, "tls.crt")
	require.Len(w.t, cas, 1)
	return cas[0]
}

// servesLeafOf reports whether replica n serves a leaf signed by ca.
func (w *emergencyWorld) servesLeafOf(n int, ca *x509.Certificate) bool {
	leaf := w.replicas[n].Leaf()
	return leaf != nil && leaf.CheckSignatureFrom(ca) == nil
}

// ready fails the test unless every replica's ca-rotation readiness check
// passes and its last check succeeded.
func (w *emergencyWorld) ready() {
	w.t.Helper()
	for n, a := range w.replicas {
		require.NoError(w.t, authority.RotationCheck(a).Check(nil), "replica %d's readiness", n)
		require.NoError(w.t, a.LastError(), "replica %d", n)
	}
}

// newForeignCA is a CA made outside the Authority, as an operator pastes
// one: valid from an hour ago for 8 hours on the world's clock.
func (w *emergencyWorld) newForeignCA(cn string) *pki.Issued {
	w.t.Helper()
	ca, err := pki.NewCA(pki.Request{CommonName: cn, Now: w.clk.Now(), Lifetime: 8 * time.Hour, Backdate: time.Hour})
	require.NoError(w.t, err)
	return ca
}

// TestHandEditedBrokenSecretIsRepaired (issue 27 §3): three replicas with a
// caBundle publisher and a client following the published caBundle; an
// operator breaks the CA Secret by hand. The replicas hold what is missing
// (the signing CA and its key, the bundle they publish), so the Secret is
// written back as it was within seconds, readiness stays green, and the
// rotation goes on: the CA is replaced by an observed successor with no
// failed handshake and no leaf lost at the CA's end.
func TestHandEditedBrokenSecretIsRepaired(t *testing.T) {
	t.Parallel() // see guard
	for _, form := range []struct {
		name string
		edit func(w *emergencyWorld, s *corev1.Secret)
	}{
		{"mismatched tls.key", func(w *emergencyWorld, s *corev1.Secret) {
			s.Data[corev1.TLSPrivateKeyKey] = w.newForeignCA("other").KeyPEM
		}},
		{"garbage ca.crt", func(_ *emergencyWorld, s *corev1.Secret) {
			s.Data[dynamiccert.SecretCAKey] = []byte("-----BEGIN CERTIFICATE-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE-----\n")
		}},
		{"tls.crt removed", func(_ *emergencyWorld, s *corev1.Secret) {
			delete(s.Data, corev1.TLSCertKey)
		}},
	} {
		if !*authority.LongScenarios && form.name != "garbage ca.crt" {
			continue // make soak runs every form; the simulator garbles each part
		}
		t.Run(form.name, func(t *testing.T) {
			w := newEmergencyWorld(t)
			good := w.secret()
			first := w.signingCA()
			w.editSecret(func(s *corev1.Secret) { form.edit(w, s) })
			for range 5 {
				w.step(time.Second)
			}
			s := w.secret()
			_, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
			require.NoError(t, err, "the Secret was not repaired: tls.crt/tls.key")
			require.Equal(t, string(good.Data[corev1.TLSCertKey]), string(s.Data[corev1.TLSCertKey]), "tls.crt written back")
			require.Equal(t, string(good.Data[corev1.TLSPrivateKeyKey]), string(s.Data[corev1.TLSPrivateKeyKey]), "tls.key written back")
			require.Equal(t, string(good.Data[dynamiccert.SecretCAKey]), string(s.Data[dynamiccert.SecretCAKey]), "ca.crt written back")
			w.ready()

			// The rotation goes on from the repaired Secret: a successor is
			// published, observed and signs before the first CA ends, and
			// the follower never fails (w.step handshakes every step).
			end := first.NotAfter
			for n := range w.replicas {
				for w.servesLeafOf(n, first) {
					require.True(t, w.clk.Now().Before(end), "replica %d still serves a leaf of the first CA at its end", n)
					w.step(time.Minute)
				}
			}
			w.ready()
			require.Zero(t, w.failed.Load(), "failed handshakes of a client following the caBundle")
			for n, a := range w.replicas {
				require.Zero(t, a.Status().UnsafeRotations, "replica %d", n)
			}
		})
	}
}

// TestPastedSigningCABecomesSuccessor (issue 27 §3): an operator pastes a
// new CA into tls.crt/tls.key and leaves ca.crt as it is. The pasted CA is
// not in the published bundle, so it is taken as a successor: it joins
// ca.crt and the published caBundle before any replica serves a leaf it
// signed, signs only after the minimum propagation delay and every observer,
// and meanwhile the old CA keeps signing. A client following the published
// caBundle never fails a handshake.
func TestPastedSigningCABecomesSuccessor(t *testing.T) {
	w := newEmergencyWorld(t)
	old := w.signingCA()
	pasted := w.newForeignCA("pasted-by-hand")
	pfp := authority.Fingerprint(pasted.Cert)
	delay := w.replicas[0].Config().PropagationDelay
	w.editSecret(func(s *corev1.Secret) {
		s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey] = pasted.CertPEM, pasted.KeyPEM
	})
	pastedAt := w.clk.Now()
	var published time.Time // when the published caBundle first held the pasted CA
	checkStep := func() {
		t.Helper()
		if published.IsZero() && holds(w.published(), pfp) {
			published = w.clk.Now()
			require.True(t, holds(w.secret().Data[dynamiccert.SecretCAKey], pfp), "the published caBundle holds the pasted CA but ca.crt does not")
		}
		for n := range w.replicas {
			if !w.servesLeafOf(n, pasted.Cert) {
				continue
			}
			require.False(t, published.IsZero(), "at %s replica %d serves a leaf signed by the pasted CA, which the published caBundle does not hold",
				w.clk.Now().UTC().Format(time.RFC3339), n)
			require.GreaterOrEqual(t, w.clk.Since(published), delay-time.Minute,
				"replica %d signs with the pasted CA %v after it was published (minimum propagation delay %v)", n, w.clk.Since(published), delay)
		}
	}
	// The pasted CA is older than the one that signs (made an hour ago), so
	// the caBundle publisher first takes the published bundle for a later
	// step of a rotation and waits out its grace (10 s) before it writes.
	for range 30 {
		w.step(time.Second)
		checkStep()
	}
	require.False(t, published.IsZero(), "the pasted CA is not published 30 s after the paste")
	s := w.secret()
	require.Equal(t, string(pasted.CertPEM), string(s.Data[authority.NextCertKey]), "the pasted CA waits as the successor")
	require.True(t, old.Equal(w.signingCA()), "the CA that signed before the paste signs until the pasted one is observed")
	for n := range w.replicas {
		require.True(t, w.servesLeafOf(n, old), "replica %d serves a leaf of the CA in force before the paste", n)
	}
	w.ready()
	for n := range w.replicas {
		for !w.servesLeafOf(n, pasted.Cert) {
			require.Less(t, w.clk.Since(pastedAt), 3*delay, "replica %d does not sign with the pasted CA %v after the paste", n, w.clk.Since(pastedAt))
			w.step(time.Minute)
			checkStep()
		}
	}
	require.True(t, pasted.Cert.Equal(w.signingCA()), "the pasted CA signs")
	w.ready()
	require.Zero(t, w.failed.Load(), "failed handshakes of a client following the caBundle")
	for n, a := range w.replicas {
		require.Zero(t, a.Status().UnsafeRotations, "replica %d", n)
	}
}

// TestPastedSigningCAWithCompromisedMark (issue 27 §3): in one edit, an
// operator pastes a new CA into tls.crt/tls.key and marks the CA that signs
// compromised. The paste is a successor pending at the mark, so the
// emergency rotation treats it as it treats any such successor: it never
// signs (its key sat in the Secret beside the compromised one) and a fresh
// successor replaces the compromised CA. A client following the published
// caBundle never fails, and no replica ever serves a leaf of the pasted CA.
func TestPastedSigningCAWithCompromisedMark(t *testing.T) {
	w := newEmergencyWorld(t)
	old := w.signingCA()
	fp := authority.Fingerprint(old)
	pasted := w.newForeignCA("pasted-by-hand")
	w.editSecret(func(s *corev1.Secret) {
		s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey] = pasted.CertPEM, pasted.KeyPEM
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[authority.CompromisedCAAnnotation] = fp
		s.Annotations[authority.CompromisedReasonAnnotation] = "key leaked in a backup"
	})
	marked := w.clk.Now()
	for holds(w.published(), fp) || holds(w.secret().Data[dynamiccert.SecretCAKey], fp) {
		require.Less(t, w.clk.Since(marked), 10*time.Minute, "the compromised CA is still trusted")
		w.step(time.Second)
		for n := range w.replicas {
			require.False(t, w.servesLeafOf(n, pasted.Cert), "replica %d serves a leaf of the pasted CA", n)
		}
	}
	for range 10 {
		w.step(time.Second)
	}
	s := w.secret()
	require.False(t, bytes.Contains(s.Data[dynamiccert.SecretCAKey], pasted.CertPEM), "the pasted CA stays in ca.crt")
	require.NotContains(t, [][]byte{s.Data[corev1.TLSCertKey], s.Data[authority.NextCertKey]}, pasted.CertPEM)
	for n := range w.replicas {
		require.False(t, w.servesLeafOf(n, pasted.Cert), "replica %d serves a leaf of the pasted CA", n)
		require.False(t, w.servesLeafOf(n, old), "replica %d serves a leaf of the compromised CA", n)
	}
	require.Zero(t, w.failed.Load(), "failed handshakes of a client following the caBundle")
	t.Logf("compromised CA untrusted %v after the mark", w.clk.Since(marked))
}
