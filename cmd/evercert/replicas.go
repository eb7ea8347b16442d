package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// replica is what one Authority replica announces in its Lease.
type replica struct {
	Lease string `json:"lease"`
	ID    string `json:"id"`
	// Live is judged on this tool's clock: ExpiresAt is after now. A clock
	// skewed against the replica's misjudges it (the Authority itself
	// judges by when it saw the renewal).
	Live      bool       `json:"live"`
	RenewTime *time.Time `json:"renewTime,omitempty"`
	// ExpiresAt is the Lease's renewTime plus as long as a replica that
	// saw the renewal when it was made waits for it
	// (authority.LeaseWaitedFor: its duration and the margin for clocks).
	// A replica that saw it later (a lagging watch, a process started
	// since) waits from then: it may still wait for a replica reported
	// gone.
	ExpiresAt  *time.Time `json:"expiresAt,omitempty"`
	TrustedCAs []string   `json:"trustedCAs"`
	// DelayedCAs are the successors its observers confirmed whose
	// minimum propagation delay still runs on its clock
	// (authority.DelayedCAPrefix): not trusted yet.
	DelayedCAs []string `json:"delayedCAs,omitempty"`
	LeafSerial string   `json:"leafSerial,omitempty"`
	// LeafCA is the Fingerprint of the CA the served leaf's signature
	// verifies with, among the Secret's CAs; empty if none.
	LeafCA       string    `json:"leafCA,omitempty"`
	LeafNotAfter time.Time `json:"leafNotAfter,omitzero"`
	// LeafNames are the announced leaf's DNS names and IP addresses.
	LeafNames []string `json:"leafNames,omitempty"`
	// Verified is whether the announcement is believed as the Authority
	// believes one (authority.VerifyAnnouncement); Rejection says why
	// not. A rejected Lease is not a replica: it is not counted as live,
	// as a pending observer, or against the targets.
	Verified  bool           `json:"verified"`
	Rejection *rejectionInfo `json:"rejection,omitempty"`

	leaf *x509.Certificate
	// duration is the Lease's leaseDurationSeconds; a replica renews
	// every third of it.
	duration time.Duration
}

// rejectionInfo is why an announcement is not believed.
type rejectionInfo struct {
	// Reason is "unsigned", "garbled" or "forged", as the Authority counts
	// it in evercert_replica_announcements_rejected_total.
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// believed reports whether r is a live replica whose announcement verifies.
func (r replica) believed() bool { return r.Live && r.Verified }

// waitedOn names r as a replica the Authority waits on. A replica renews
// its Lease every third of its duration; one that missed two renewals is
// likely a stopped process (a killed pod leaves its Lease behind), and the
// name says so and until when its peers count it live, so that an operator
// waiting on it knows the wait ends by itself.
func (r replica) waitedOn(now time.Time) string {
	if r.RenewTime == nil || r.duration <= 0 {
		return r.ID
	}
	interval := r.duration / 3
	since := now.Sub(*r.RenewTime)
	if since <= 2*interval {
		return r.ID
	}
	return fmt.Sprintf("%s (no renewal for %s, %d renewal intervals of %s: a stopped process? counted live until %s)",
		r.ID, since.Round(time.Second), int(since/interval), interval, r.ExpiresAt.Format(time.RFC3339))
}

// replicas lists the Leases of the Authority whose CA Secret is secret, by
// Lease name, each verified against cas (the CAs the Secret holds) and,
// when hosts is not empty, the Authority's names or those listed in the
// Secret (authority.ReplicaNames).
func (k *kube) replicas(ctx context.Context, secret string, now time.Time, cas []*x509.Certificate, hosts, listed []string) ([]replica, error) {
	selector := authority.LeaseSelector(secret)
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
			r.duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
			expires := renew.Add(authority.LeaseWaitedFor(r.duration))
			r.RenewTime, r.ExpiresAt, r.Live = &renew, &expires, now.Before(expires)
		}
		if v := l.Annotations[authority.TrustedCAsAnnotation]; v != "" {
			for _, fp := range strings.Split(v, ",") {
				if d, ok := strings.CutPrefix(fp, authority.DelayedCAPrefix); ok {
					r.DelayedCAs = append(r.DelayedCAs, d)
				} else {
					r.TrustedCAs = append(r.TrustedCAs, fp)
				}
			}
		}
		r.LeafSerial = l.Annotations[authority.LeafSerialAnnotation]
		if r.leaf = parseCertPEM([]byte(l.Annotations[authority.LeafAnnotation])); r.leaf != nil {
			r.LeafSerial = r.leaf.SerialNumber.Text(16)
			r.LeafNotAfter = r.leaf.NotAfter.UTC()
			r.LeafNames = append(slices.Clone(r.leaf.DNSNames), ipStrings(r.leaf)...)
		}
		// The Authority's own check, so that this tool believes exactly
		// the announcements the replicas believe of each other (replay
		// aside: that takes the history a running replica keeps).
		if _, err := authority.VerifyAnnouncement(&l, cas, hosts, listed); err != nil {
			rej := &rejectionInfo{Reason: "forged", Message: err.Error()}
			var ae *authority.AnnouncementError
			if errors.As(err, &ae) {
				rej.Reason, rej.Message = ae.Reason, ae.Err.Error()
			}
			r.Rejection = rej
		} else {
			r.Verified = true
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b replica) int { return strings.Compare(a.Lease, b.Lease) })
	return out, nil
}

func ipStrings(c *x509.Certificate) []string {
	out := make([]string, 0, len(c.IPAddresses))
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}

// secretCAs returns every CA the CA Secret holds, which announced leaves
// must chain to: the signing CA (tls.crt), the successor (next.crt) and
// ca.crt's, as the Authority collects them. A ca.crt that does not parse
// adds none.
func secretCAs(s *corev1.Secret) []*x509.Certificate {
	var cas []*x509.Certificate
	for _, key := range []string{corev1.TLSCertKey, authority.NextCertKey} {
		if c := parseCertPEM(s.Data[key]); c != nil {
			cas = append(cas, c)
		}
	}
	if b := s.Data[dynamiccert.SecretCAKey]; len(b) > 0 {
		if bundle, err := pki.ParseCABundle(b); err == nil {
			cas = append(cas, bundle...)
		}
	}
	return cas
}

// issuer returns the Fingerprint of the CA among cas whose key signed
// leaf, or "".
func issuer(leaf *x509.Certificate, cas []*x509.Certificate) string {
	if leaf == nil {
		return ""
	}
	for _, ca := range cas {
		if leaf.CheckSignatureFrom(ca) == nil {
			return authority.Fingerprint(ca)
		}
	}
	return ""
}
