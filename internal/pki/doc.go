// Package pki holds the certificate plumbing that several evercert packages
// share: key generation, CA and leaf issuance, and strict parsing and
// validation of PEM certificate/key pairs and CA bundles.
//
// Nothing in this package logs; errors never contain key material.
//
// See docs/architecture.md for how the packages fit together.
package pki
