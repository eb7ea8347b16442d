package authority

// Annotations an operator sets on an Authority's CA Secret to act on its
// rotation (the evercert CLI sets them; kubectl annotate works too). They
// are requests: the Authority acts on each once and records that it did in
// the matching "-handled" annotation, so a request survives a restart of
// every replica and a reader can tell whether it was seen.
const (
	// RotateRequestedAnnotation asks for an observed rotation now: its
	// value is an RFC 3339 time. A successor is published at once unless
	// one is already pending; the minimum propagation delay and observer
	// confirmation apply as on schedule.
	RotateRequestedAnnotation = "evercert.io/rotate-requested"
	// RotateHandledAnnotation is set by the Authority to the value of
	// RotateRequestedAnnotation it acted on.
	RotateHandledAnnotation = "evercert.io/rotate-handled"
	// CompromisedCAAnnotation marks a CA compromised: its value is the
	// CA's Fingerprint. The Authority starts an emergency rotation.
	CompromisedCAAnnotation = "evercert.io/compromised-ca"
	// CompromisedReasonAnnotation records why, in the operator's words.
	CompromisedReasonAnnotation = "evercert.io/compromised-reason"
	// CompromisedAtAnnotation is when the CA was marked, RFC 3339.
	CompromisedAtAnnotation = "evercert.io/compromised-at"
	// CompromisedHandledAnnotation is set by the Authority to the
	// Fingerprint in CompromisedCAAnnotation once that CA is gone from the
	// Secret's ca.crt bundle.
	CompromisedHandledAnnotation = "evercert.io/compromised-handled"
)
