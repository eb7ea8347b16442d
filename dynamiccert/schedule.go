package dynamiccert

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/pki"
)

// rotation is the CA and leaf schedule that SelfSigned (state in memory) and
// Authority (state in a Secret) share. Its decisions depend only on the
// state and the time, so replicas reading the same Secret agree on them.
type rotation struct {
	name                         string
	keyType                      pki.KeyType
	caLifetime, caRenewBefore    time.Duration
	propagation, leafRenewBefore time.Duration
}

// caSet is the CA side of the state: the CA that signs, a successor already
// published in the bundle but not signing yet, and every CA clients should
// still trust.
type caSet struct {
	signing   *pki.Issued
	next      *pki.Issued
	nextSince time.Time           // when next joined the bundle
	bundle    []*x509.Certificate // oldest first
}

// advance moves cs along the schedule at now and reports whether it changed:
//
//   - with no usable signing CA (first run, expired, or the clock went back
//     before its NotBefore) a published successor signs at once if it is
//     valid (the machine slept through the propagation delay; clients that
//     refreshed their bundle already have it), else a new CA signs at once;
//   - a successor is made caRenewBefore ahead of the signing CA's expiry and
//     joins the bundle;
//   - it signs propagation later, or at once when the signing CA is within
//     leafRenewBefore of expiry, so a leaf is never capped by a dying CA;
//   - expired CAs leave the bundle.
func (r rotation) advance(cs *caSet, now time.Time) (bool, error) {
	changed := false
	if cs.signing != nil && !validAt(cs.signing, now) && cs.next != nil && validAt(cs.next, now) {
		cs.signing, cs.next, changed = cs.next, nil, true
	}
	switch {
	case cs.signing == nil || !validAt(cs.signing, now):
		ca, err := r.newCA(now)
		if err != nil {
			return false, fmt.Errorf("making CA: %w", err)
		}
		cs.signing, cs.next, changed = ca, nil, true
		klog.V(1).InfoS("Created signing CA", "provider", r.name, "serial", serial(ca.Cert), "notAfter", ca.Cert.NotAfter)
	case !now.Before(cs.signing.Cert.NotAfter.Add(-r.caRenewBefore)):
		if cs.next == nil {
			ca, err := r.newCA(now)
			if err != nil {
				return false, fmt.Errorf("making successor CA: %w", err)
			}
			cs.next, cs.nextSince, changed = ca, now, true
			klog.V(1).InfoS("Published successor CA", "provider", r.name, "serial", serial(ca.Cert), "signsAfter", now.Add(r.propagation))
		}
		if !now.Before(cs.nextSince.Add(r.propagation)) || !now.Before(cs.signing.Cert.NotAfter.Add(-r.leafRenewBefore)) {
			cs.signing, cs.next, changed = cs.next, nil, true
			klog.V(1).InfoS("Successor CA now signs", "provider", r.name, "serial", serial(cs.signing.Cert))
		}
	}
	for _, ca := range []*pki.Issued{cs.signing, cs.next} {
		if ca != nil && !slices.ContainsFunc(cs.bundle, ca.Cert.Equal) {
			cs.bundle, changed = append(cs.bundle, ca.Cert), true
		}
	}
	kept := slices.DeleteFunc(slices.Clone(cs.bundle), func(c *x509.Certificate) bool { return !now.Before(c.NotAfter) })
	if len(kept) != len(cs.bundle) {
		cs.bundle, changed = kept, true
	}
	return changed, nil
}

func (r rotation) newCA(now time.Time) (*pki.Issued, error) {
	return pki.NewCA(pki.Request{CommonName: r.name + "-ca", KeyType: r.keyType, Now: now, Lifetime: r.caLifetime})
}

// leafDue reports whether leaf, signed by the CA whose raw certificate is
// signedBy, must be re-issued at now: there is none, its CA no longer signs,
// the clock went back before its NotBefore, or it is within leafRenewBefore
// of expiry. A leaf capped at its CA's expiry cannot get longer by re-signing
// with the same CA, so only a CA change renews it and this never spins.
func (r rotation) leafDue(leaf *pki.Issued, signedBy []byte, cs *caSet, now time.Time) bool {
	switch {
	case leaf == nil, !bytes.Equal(signedBy, cs.signing.Cert.Raw), now.Before(leaf.Cert.NotBefore):
		return true
	}
	return !now.Before(leaf.Cert.NotAfter.Add(-r.leafRenewBefore)) && leaf.Cert.NotAfter.Before(cs.signing.Cert.NotAfter)
}

// nextDeadline is the earliest time advance or leafDue will decide
// differently.
func (r rotation) nextDeadline(cs *caSet, leaf *x509.Certificate) time.Time {
	next := cs.signing.Cert.NotAfter
	if leaf.NotAfter.Before(next) {
		next = leaf.NotAfter.Add(-r.leafRenewBefore)
	}
	if cs.next == nil {
		next = earliest(next, cs.signing.Cert.NotAfter.Add(-r.caRenewBefore))
	} else {
		next = earliest(next, cs.nextSince.Add(r.propagation))
	}
	for _, c := range cs.bundle {
		next = earliest(next, c.NotAfter)
	}
	return next
}

// issueLeaf signs a serving leaf for cfg's names with the signing CA.
func (r rotation) issueLeaf(cs *caSet, commonName string, dnsNames []string, ips []net.IP, lifetime time.Duration, now time.Time) (*pki.Issued, error) {
	issued, err := pki.IssueLeaf(cs.signing, pki.Request{
		CommonName: commonName, DNSNames: dnsNames, IPs: ips,
		KeyType: r.keyType, Now: now, Lifetime: lifetime,
	})
	if err != nil {
		return nil, fmt.Errorf("issuing leaf: %w", err)
	}
	return issued, nil
}

// bundlePEM encodes the bundle, and a pool for verifying against it.
func (cs *caSet) bundlePEM() ([]byte, *x509.CertPool) {
	var b bytes.Buffer
	pool := x509.NewCertPool()
	for _, c := range cs.bundle {
		b.Write(pki.EncodeCertPEM(c.Raw))
		pool.AddCert(c)
	}
	return b.Bytes(), pool
}

// validAt reports whether now is within c's validity period.
func validAt(c *pki.Issued, now time.Time) bool {
	return !now.Before(c.Cert.NotBefore) && now.Before(c.Cert.NotAfter)
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func serial(c *x509.Certificate) string { return c.SerialNumber.Text(16) }
