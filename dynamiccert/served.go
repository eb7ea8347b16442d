package dynamiccert

import (
	"crypto/x509"
	"encoding/pem"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// This file holds what a server serves, as a published CA bundle must
// verify it: cabundle checks every published bundle against these chains.

// ServedChain is a certificate chain a server presents in its TLS
// handshakes: the leaf first, then any intermediates.
type ServedChain struct {
	// Server names the server, for logs and Events: a provider's name or
	// a replica's ID.
	Server string
	// Chain is the leaf followed by its intermediates; never empty.
	Chain []*x509.Certificate
}

// ServedChainLister lists the chains that servers present now. Its method
// must be safe for concurrent use and cheap: it is called on every change
// of a published bundle.
type ServedChainLister interface {
	ServedChains() []ServedChain
}

// ServedBy returns the ServedChainLister of the chain that provider serves
// in this process (a FileCertKey on the kubelet's credential bundle, a
// Secret, an Authority's leaf): one chain while the provider has content
// that parses, none otherwise. The lister is also a
// dynamiccertificates.Notifier: its listeners are the provider's, told when
// the served chain changes.
func ServedBy(provider dynamiccertificates.CertKeyContentProvider) ServedChainLister {
	return servedBy{provider}
}

type servedBy struct {
	dynamiccertificates.CertKeyContentProvider
}

func (s servedBy) ServedChains() []ServedChain {
	certPEM, _ := s.CurrentCertKeyContent()
	var chain []*x509.Certificate
	for rest := certPEM; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			// The providers only serve chains that parsed; a chain that
			// does not is none.
			return nil
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return nil
	}
	return []ServedChain{{Server: s.Name(), Chain: chain}}
}
