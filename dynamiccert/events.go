package dynamiccert

import "github.com/evercert/evercert/internal/certreport"

// Reasons of the Kubernetes Events evercert sends. Every provider config
// has the same two optional fields for them: EventRecorder
// (k8s.io/client-go/tools/events) and EventObject, the object the Events
// are about (the Pod, say; providers reading a Secret default to it). The
// sni controller takes the same pair (sni.WithEventRecorder), and the
// cabundle publisher sends its own reasons about the objects it publishes
// to.
//
// Events follow what is logged and counted: one CertificateRotated Event
// per certificate change (not for the first certificate), and one
// CertificateLoadFailed Event per distinct load failure, as counted in
// evercert_certificate_load_errors_total; a failure retried with the same
// error and the same content sends no further Event.
const (
	// ReasonCertificateRotated (Normal): a provider serves a new
	// certificate in place of an earlier one.
	ReasonCertificateRotated = certreport.ReasonCertificateRotated
	// ReasonCertificateLoadFailed (Warning): a provider's new content, or
	// reading it, failed; the last good content is still served.
	ReasonCertificateLoadFailed = certreport.ReasonCertificateLoadFailed
	// ReasonUnsafeCARotation (Warning): a CA signed before every observer
	// confirmed it, because no observed CA was valid any more; clients must
	// refresh their trust.
	ReasonUnsafeCARotation = certreport.ReasonUnsafeCARotation
	// ReasonClockSkew (Warning): an Authority replica's clock disagrees
	// with the CA Secret or with the other replicas' Lease renewals beyond
	// the skew tolerance, so it does not write the Secret; sent once when
	// that starts.
	ReasonClockSkew = certreport.ReasonClockSkew
	// ReasonEmergencyCARotation (Warning): a step of an emergency rotation
	// away from a CA marked compromised (CompromisedCAAnnotation), about
	// the CA Secret: successor published, successor signs, this replica's
	// leaf re-issued, compromised CA removed from ca.crt.
	ReasonEmergencyCARotation = certreport.ReasonEmergencyCARotation
	// ReasonCARotationRequested (Normal): the Authority acted on
	// RotateRequestedAnnotation, about the CA Secret.
	ReasonCARotationRequested = certreport.ReasonCARotationRequested
	// ReasonCARequestIgnored (Warning): CompromisedCAAnnotation names no
	// CA in the Secret; nothing was done. Sent once per value.
	ReasonCARequestIgnored = certreport.ReasonCARequestIgnored
	// ReasonCASecretRepaired (Warning): the Authority found its CA Secret
	// edited by hand into content it must not use as it is, and wrote back
	// what it holds: a part that does not parse (a tls.key that is not
	// tls.crt's key, garbage in ca.crt, tls.crt removed) as this replica
	// last held it, or a signing CA pasted into tls.crt that ca.crt does
	// not publish, made the successor (published, observed, then used).
	// Sent once per edit, about the CA Secret.
	ReasonCASecretRepaired = certreport.ReasonCASecretRepaired
	// ReasonForeignCASecretWriter (Warning): another rotator (the one the
	// Authority adopted the Secret from, authority.Config.Adopt) rewrote
	// the CA Secret in its layout with a CA the Authority never had, after
	// the Authority adopted or wrote it: the old rotator still runs (a
	// rolling update from it). The Authority keeps serving what it has,
	// adopts nothing and reports Stalled (readiness stays green while it
	// serves a valid leaf) until the Secret is left alone for a quiet period (a check interval, backed off while
	// the rotator answers each adoption), then adopts it once. Sent once
	// per episode, about the CA Secret.
	ReasonForeignCASecretWriter = certreport.ReasonForeignCASecretWriter
)
