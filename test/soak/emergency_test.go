//go:build soak

package soak

import (
	"crypto/tls"
	"crypto/x509"
	"slices"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/tlstest"
)

// emergencyScenario marks the Authority's signing CA compromised (issue
// 21, emergency rotation) in the middle of a fault: "pause" (the mark is
// written and the cluster is suspended for a day across the scheduled
// publication), "api-outage" (every request fails for three minutes from
// the mark) or "replica-down" (replica 2, which holds no publisher, is down
// from before the mark until it is handled; its Lease keeps counting as
// live for a lease duration). Every step checks the usual invariant, with
// one change: bundles a replica published before the mark may fail once
// the compromised CA is gone (that is the point); a client following the
// webhook's caBundle never may. The cycle ends with the compromised CA
// gone from ca.crt and the caBundle, the Secret recording it handled, and a
// client that trusts only the compromised CA failing on every live replica.
func emergencyScenario(name, during string) scenario {
	return scenario{name: name, cycle: func(w *world, _ int) {
		w.runTo(w.publishAt().Add(-time.Hour))
		var victim *pod
		switch during {
		case "api-outage":
			w.api.fault.Store(internalErrorFault())
		case "replica-down":
			victim = w.pods[2]
			w.act(victim.teardown)
		}
		bad, marked := w.markCompromised(), w.now()
		switch during {
		case "pause":
			w.pause(day)
		case "api-outage":
			w.fine(3*time.Minute, 5*time.Second, time.Minute)
			require.Positive(w.t, w.api.faultHits.Load(), "the fault was hit")
			w.api.fault.Store(nil)
			w.advance(time.Minute)
		}
		fp := authority.Fingerprint(bad)
		untrusted := func() bool {
			s := w.api.secret(namespace, secretName)
			return s != nil && s.Annotations[authority.CompromisedHandledAnnotation] == fp && !holdsCA(w.webhookBundle(), fp) &&
				!holdsCA(s.Data[dynamiccert.SecretCAKey], fp)
		}
		// Fine steps first: without a fault in the way it takes no time
		// on the clock at all.
		for range 10 {
			if untrusted() {
				break
			}
			w.advance(time.Second)
		}
		w.runUntil("the compromised CA gone from ca.crt and the webhook's caBundle", w.p.lease+2*day, untrusted)
		w.t.Logf("%s: compromised CA %s untrusted everywhere %s after the mark (simulated)", w.name, serialOf(bad), formatDuration(w.now().Sub(marked)))
		for _, p := range w.live() {
			_, err := tlstest.Handshake(p.srv.addr, &tls.Config{ServerName: authorityHost, RootCAs: w.pool(pki.EncodeCertPEM(bad.Raw)), Time: p.view.Now})
			require.Error(w.t, err, "%s still serves a leaf of the compromised CA", p.name)
			require.False(w.t, holdsCA(p.auth.CurrentCABundleContent(), fp), "%s's bundle holds the compromised CA", p.name)
		}
		if victim != nil {
			w.act(func() { w.startPod(victim.idx) })
		}
		w.runFor(w.p.step)
	}}
}

// markCompromised annotates the CA Secret as an operator does (kubectl
// annotate, the evercert CLI) and returns the CA marked: the signing CA.
func (w *world) markCompromised() *x509.Certificate {
	w.t.Helper()
	st, ok := w.caState()
	require.True(w.t, ok, "no CA secret")
	s := w.api.secret(namespace, secretName).DeepCopy()
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[authority.CompromisedCAAnnotation] = authority.Fingerprint(st.signing)
	s.Annotations[authority.CompromisedReasonAnnotation] = "soak: " + w.name
	s.Annotations[authority.CompromisedAtAnnotation] = w.now().UTC().Format(time.RFC3339)
	require.NoError(w.t, w.api.tracker.Update(secretsGVR, s, namespace, metav1.UpdateOptions{}))
	w.emergencyAt = append(w.emergencyAt, w.now())
	return st.signing
}

// beforeEmergency reports whether a replica's bundle published at at
// predates an emergency rotation that already began: a client holding it
// may fail once the compromised CA is gone.
func (w *world) beforeEmergency(at time.Time) bool {
	return slices.ContainsFunc(w.emergencyAt, func(e time.Time) bool { return at.Before(e) && !w.now().Before(e) })
}

func holdsCA(bundle []byte, fp string) bool {
	cas, err := pki.ParseCABundle(bundle)
	return err == nil && slices.ContainsFunc(cas, func(c *x509.Certificate) bool { return authority.Fingerprint(c) == fp })
}
