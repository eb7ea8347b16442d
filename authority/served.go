package authority

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"slices"
	"strings"

	"github.com/evercert/evercert/dynamiccert"
)

// ServedChains lists the leaf every live replica of the Authority
// announced in its Lease (LeafAnnotation), this replica's
// included, by "replica/<id>": what clients of any replica are served,
// for cabundle to check the published bundles against. With
// DisableReplicaAnnouncements it is this replica's own leaf. A replica is
// live as long as it counts for a rotation: until its lease duration and a
// margin (twice the skew tolerance, at most a third of the duration) have
// passed, on this process's clock, since its last renewal was seen.
func (a *Authority) ServedChains() []dynamiccert.ServedChain {
	if a.replicas == nil {
		if leaf := a.Leaf(); leaf != nil {
			return []dynamiccert.ServedChain{{Server: a.Name(), Chain: []*x509.Certificate{leaf}}}
		}
		return nil
	}
	return a.replicas.servedChains()
}

var _ dynamiccert.ServedChainLister = (*Authority)(nil)

// AnnouncesCABundle reports whether bundle is, byte for byte, the CA
// bundle a live replica of this Authority (this one included) announces in
// its Lease that it loaded: a caBundle publisher of the Authority finds
// that another replica of it, not another writer, wrote bundle, also one
// that is a step behind or ahead of this replica in a CA rotation. Only
// believed announcements count (see SignatureAnnotation), so
// someone who may write Leases cannot make a bundle look like a
// replica's. Without replica announcements, only this replica's own
// bundle is one.
func (a *Authority) AnnouncesCABundle(bundle []byte) bool {
	if len(bundle) == 0 {
		return false
	}
	if bytes.Equal(bundle, a.CurrentCABundleContent()) {
		return true
	}
	if a.replicas == nil {
		return false
	}
	sum := sha256.Sum256(bundle)
	return a.replicas.announcesBundle(hex.EncodeToString(sum[:]))
}

// announcesBundle reports whether a live replica announces the bundle
// whose SHA-256 is hash.
func (r *replicaSet) announcesBundle(hash string) bool {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	unseen := r.unseenLocked(now)
	for _, l := range r.seen {
		if l.bundleHash == hash && !l.deleted && r.waitedForLocked(l, now, unseen) {
			return true
		}
	}
	return false
}

// servedChains returns the announced leaf of every live replica, sorted by
// replica.
func (r *replicaSet) servedChains() []dynamiccert.ServedChain {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	unseen := r.unseenLocked(now)
	var out []dynamiccert.ServedChain
	for _, l := range r.seen {
		if l.leaf != nil && !l.deleted && r.waitedForLocked(l, now, unseen) {
			out = append(out, dynamiccert.ServedChain{Server: "replica/" + l.holder, Chain: []*x509.Certificate{l.leaf}})
		}
	}
	slices.SortFunc(out, func(x, y dynamiccert.ServedChain) int { return strings.Compare(x.Server, y.Server) })
	return out
}

// leafCertPEM is the PEM of a leaf certificate, for its announcement.
func leafCertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// parseAnnouncedLeaf parses an announced leaf; nil when there is none or
// it does not parse (it then verifies nothing, and is checked by nothing).
// Callers go through costly.parseLeaf.
func parseAnnouncedLeaf(s string) *x509.Certificate {
	block, _ := pem.Decode([]byte(s))
	if block == nil || block.Type != "CERTIFICATE" {
		return nil
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	return c
}
