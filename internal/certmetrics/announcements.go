package certmetrics

import "k8s.io/component-base/metrics"

// Reasons an Authority replica ignores another replica's Lease
// announcement, the values of the reason label of
// evercert_replica_announcements_rejected_total.
const (
	// AnnouncementForged: the signature does not verify over what the
	// Lease says, or the announced leaf does not chain to a CA in the
	// Secret.
	AnnouncementForged = "forged"
	// AnnouncementReplayed: validly signed, but older than the last
	// announcement believed for that Lease (its renewTime or its leaf).
	AnnouncementReplayed = "replayed"
	// AnnouncementGarbled: the signature, the leaf PEM or the renewTime
	// does not parse.
	AnnouncementGarbled = "garbled"
	// AnnouncementUnsigned: no signature at all, as an evercert release
	// from before signed announcements writes (a rolling upgrade).
	AnnouncementUnsigned = "unsigned"
)

var replicaAnnouncementsRejected = metrics.NewCounterVec(&metrics.CounterOpts{
	Namespace:      namespace,
	Name:           "replica_announcements_rejected_total",
	Help:           "Number of versions of other replicas' Lease announcements an Authority replica ignored, by reason (forged, replayed, garbled, unsigned). An ignored announcement neither confirms a successor CA nor counts as clock-skew evidence, and its replica is not waited for once its last believed announcement ages out.",
	StabilityLevel: metrics.ALPHA,
}, []string{"provider", "reason"})

// ReplicaAnnouncementRejected records that provider (an Authority replica)
// ignored one version of a replica's Lease announcement for reason.
func ReplicaAnnouncementRejected(provider, reason string) {
	Register()
	replicaAnnouncementsRejected.WithLabelValues(provider, reason).Inc()
}

var replicaLeaseWritesForbidden = metrics.NewCounterVec(&metrics.CounterOpts{
	Namespace:      namespace,
	Name:           "replica_lease_writes_forbidden_total",
	Help:           "Number of writes of an Authority replica's own Lease that RBAC forbade, by provider and verb (create, update, get). Counted at every attempt (they back off), so the rate stays above zero for as long as it lasts: the other replicas cannot see this replica's announcements and do not wait for it before a successor CA signs.",
	StabilityLevel: metrics.ALPHA,
}, []string{"provider", "verb"})

// ReplicaLeaseWriteForbidden records that RBAC forbade verb on provider's
// (an Authority replica's) own Lease.
func ReplicaLeaseWriteForbidden(provider, verb string) {
	Register()
	replicaLeaseWritesForbidden.WithLabelValues(provider, verb).Inc()
}
