package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Roles a served certificate can have (ServingCertificateStatus.Role).
const (
	// RoleServing is the default serving certificate
	// (SecureServingInfo.Cert): presented when no SNI certificate matches.
	RoleServing = "serving"
	// RoleSNI is a certificate presented only for the SNI names it claims
	// (SecureServingInfo.SNICerts).
	RoleSNI = "sni"
	// RoleLoopback is the loopback certificate, presented for the SNI name
	// apiserver-loopback-client only.
	RoleLoopback = "loopback"
)

// ServingCertificate describes one certificate the server serves, as its
// provider holds it at the time of the request.
type ServingCertificate struct {
	metav1.TypeMeta `json:",inline"`
	// ObjectMeta.Name is the provider name.
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Status is the observed certificate.
	Status ServingCertificateStatus `json:"status"`
}

// ServingCertificateStatus is what the provider currently serves.
type ServingCertificateStatus struct {
	// Provider is the name of the certificate provider.
	Provider string `json:"provider"`
	// Role is RoleServing, RoleSNI or RoleLoopback.
	Role string `json:"role"`
	// Subject is the leaf certificate's subject distinguished name.
	Subject string `json:"subject,omitempty"`
	// Issuer is the leaf certificate's issuer distinguished name.
	Issuer string `json:"issuer,omitempty"`
	// Names are the DNS names and IP addresses of the leaf certificate.
	Names []string `json:"names,omitempty"`
	// SNINames, when set, are the explicit SNI names the certificate is
	// selected for; they replace the names taken from the certificate.
	SNINames []string `json:"sniNames,omitempty"`
	// Serial is the leaf certificate's serial number, in hexadecimal.
	Serial string `json:"serial,omitempty"`
	// AuthorityKeyID is the leaf's authority key identifier, in
	// hexadecimal: it identifies the CA that signed the leaf, and changes
	// when that CA rotates.
	AuthorityKeyID string `json:"authorityKeyID,omitempty"`
	// NotBefore is the start of the leaf certificate's validity.
	NotBefore metav1.Time `json:"notBefore,omitzero"`
	// NotAfter is the end of the leaf certificate's validity.
	NotAfter metav1.Time `json:"notAfter,omitzero"`
	// Error is set, and the certificate fields are empty, when the
	// provider's current content cannot be parsed.
	Error string `json:"error,omitempty"`
}

// ServingCertificateList is the list of served certificates.
type ServingCertificateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items holds one entry per certificate provider: the default serving
	// certificate first, then the SNI certificates in the order the server
	// consults them.
	Items []ServingCertificate `json:"items"`
}
