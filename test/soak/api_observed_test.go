//go:build soak

package soak

// This file wires the soak to the observed-rotation API of issue 11:
// observers, status, replica leases, skew tolerance, Events, and a caBundle
// publisher driven by the scenario's clock.

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
)

const observedAPI = true

func newAuthority(cfg authority.Config, o extraOptions) (*authority.Authority, error) {
	cfg.ReplicaID = o.replicaID
	cfg.LeaseDuration = o.lease
	cfg.SkewTolerance = o.skewTolerance
	cfg.EventRecorder = o.recorder
	return authority.New(cfg)
}

func newSelfSigned(cfg authority.SelfSignedConfig, o extraOptions) (*authority.SelfSigned, error) {
	cfg.SkewTolerance = o.skewTolerance
	cfg.EventRecorder = o.recorder
	cfg.EventObject = &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: namespace, Name: cfg.Name}
	return authority.NewSelfSigned(cfg)
}

func newPublisher(cfg cabundle.PublisherConfig, name string, clk *offsetClock, rec *eventRecorder) (*cabundle.Publisher, error) {
	cfg.Name = name
	cfg.Clock = clk
	cfg.EventRecorder = rec
	return cabundle.NewPublisher(cfg)
}

// observe makes the replica that runs the publisher wait, before a
// successor signs, until the webhook configuration holds it.
func observe(a *authority.Authority, p *cabundle.Publisher) { a.AddObserver(p) }

func authorityStatus(a *authority.Authority) (rotationStatus, bool) {
	return fromStatus(a.Status()), true
}

func selfSignedStatus(s *authority.SelfSigned) (rotationStatus, bool) {
	return fromStatus(s.Status()), true
}

func fromStatus(s authority.RotationStatus) rotationStatus {
	r := rotationStatus{
		signingSerial:   s.Signing.Serial,
		signingNotAfter: s.Signing.NotAfter,
		unsafe:          s.UnsafeRotations,
		clockSkew:       s.ClockSkew,
	}
	if s.Successor != nil {
		r.successorSerial = s.Successor.Serial
		r.successorPublishedAt = s.Successor.PublishedAt
		r.pending = s.Successor.Pending
	}
	return r
}

func publisherHealth(p *cabundle.Publisher) error { return p.HealthCheck().Check(nil) }
