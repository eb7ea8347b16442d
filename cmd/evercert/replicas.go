package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/dynamiccert"
)

// replica is what one Authority replica announces in its Lease.
type replica struct {
	Lease string `json:"lease"`
	ID    string `json:"id"`
	// Live is judged on this tool's clock: the Lease's renewTime plus its
	// duration is after now. A clock skewed against the replica's misjudges
	// it (the Authority itself judges by when it saw the renewal).
	Live       bool       `json:"live"`
	RenewTime  *time.Time `json:"renewTime,omitempty"`
	ExpiresAt  *time.Time `json:"expiresAt,omitempty"`
	TrustedCAs []string   `json:"trustedCAs"`
	LeafSerial string     `json:"leafSerial,omitempty"`
	// LeafCA is the Fingerprint of the CA the served leaf's signature
	// verifies with, among the Secret's CAs; empty if none.
	LeafCA       string    `json:"leafCA,omitempty"`
	LeafNotAfter time.Time `json:"leafNotAfter,omitzero"`

	leaf *x509.Certificate
}

// replicas lists the Leases of the Authority whose CA Secret is secret, by
// Lease name.
func (k *kube) replicas(ctx context.Context, secret string, now time.Time) ([]replica, error) {
	selector := dynamiccert.AuthorityLeaseSelector(secret)
	leases, err := k.client.CoordinationV1().Leases(k.namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("listing the replica Leases (%s) in namespace %s: %w", selector, k.namespace, err)
	}
	var out []replica
	for _, l := range leases.Items {
		r := replica{Lease: l.Name, ID: l.Name, TrustedCAs: []string{}}
		if h := l.Spec.HolderIdentity; h != nil && *h != "" {
			r.ID = *h
		}
		if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
			renew := l.Spec.RenewTime.UTC()
			expires := renew.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
			r.RenewTime, r.ExpiresAt, r.Live = &renew, &expires, now.Before(expires)
		}
		if v := l.Annotations[dynamiccert.AuthorityTrustedCAsAnnotation]; v != "" {
			r.TrustedCAs = strings.Split(v, ",")
		}
		r.LeafSerial = l.Annotations[dynamiccert.AuthorityLeafSerialAnnotation]
		if r.leaf = parseCertPEM([]byte(l.Annotations[dynamiccert.AuthorityLeafAnnotation])); r.leaf != nil {
			r.LeafSerial = r.leaf.SerialNumber.Text(16)
			r.LeafNotAfter = r.leaf.NotAfter.UTC()
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b replica) int { return strings.Compare(a.Lease, b.Lease) })
	return out, nil
}

// issuer returns the Fingerprint of the CA among cas whose key signed
// leaf, or "".
func issuer(leaf *x509.Certificate, cas []*x509.Certificate) string {
	if leaf == nil {
		return ""
	}
	for _, ca := range cas {
		if leaf.CheckSignatureFrom(ca) == nil {
			return dynamiccert.Fingerprint(ca)
		}
	}
	return ""
}
