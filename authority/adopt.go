package authority

import (
	"crypto"
	"crypto/x509"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// SecretLayout names the layout of a CA Secret written by another rotator,
// which an Authority adopts in place (Config.Adopt): the Secret
// keeps its name, the CA that clients trust today stays in ca.crt, and the
// Authority rewrites the Secret in its own layout, with an Update carrying
// the resourceVersion it read (a conflict is re-read, never overwritten).
//
// Adoption is an explicit opt-in rather than auto-detected: rewriting a
// Secret that another tool still runs on makes the two fight over it, and
// only the user knows that the other tool has been stopped. A Secret in a
// foreign layout that would otherwise be taken for an empty one (knative's)
// is refused without the opt-in, so that no new, untrusted CA replaces the
// one clients trust.
type SecretLayout string

const (
	// LayoutEvercert is the Authority's own layout (the default): tls.crt
	// and tls.key hold the signing CA, ca.crt every CA still trusted, and
	// next.crt/next.key a published successor.
	LayoutEvercert SecretLayout = ""
	// LayoutCertController is OPA cert-controller's (pkg/rotator): ca.crt
	// and ca.key hold the CA, tls.crt and tls.key the serving leaf. The CA
	// keeps signing (every replica issues its own leaf from it) until an
	// observed rotation replaces it. The adopted Secret holds the CA in
	// tls.crt/tls.key and loses ca.key.
	LayoutCertController SecretLayout = "cert-controller"
	// LayoutCertManager is cert-manager's webhook DynamicAuthority's:
	// tls.crt and tls.key hold the CA, ca.crt the same CA. That is already
	// the Authority's layout; adopting it checks that ca.crt trusts the CA
	// in tls.crt, and the CA keeps signing until an observed rotation
	// replaces it.
	LayoutCertManager SecretLayout = "cert-manager"
	// LayoutKnative is knative.dev/pkg's webhook certificates': ca-cert.pem
	// holds the CA, server-cert.pem and server-key.pem the serving leaf.
	// The CA's key is not stored, so the CA cannot sign: every replica
	// serves knative's leaf, a successor CA is published at once beside
	// knative's CA in ca.crt, and only once it is observed (PropagationDelay,
	// every Observer, every live replica) does it sign and do replicas
	// switch to leaves of their own. knative's keys are removed from the
	// Secret then; knative's CA stays in ca.crt until it expires.
	LayoutKnative SecretLayout = "knative"
)

// Keys of the foreign layouts.
const (
	certControllerCAKeyKey = "ca.key"
	knativeCACertKey       = "ca-cert.pem"
	knativeServerCertKey   = "server-cert.pem"
	knativeServerKeyKey    = "server-key.pem"
)

func (l SecretLayout) valid() error {
	switch l {
	case LayoutEvercert, LayoutCertController, LayoutCertManager, LayoutKnative:
		return nil
	}
	return fmt.Errorf("unknown secret layout %q to adopt (want %q, %q or %q)", string(l), LayoutCertController, LayoutCertManager, LayoutKnative)
}

// parseSecretLayout reads the CA state from a Secret of the given layout.
// convert reports that the Secret is still in the foreign layout and must
// be rewritten in the Authority's own even if the schedule changes nothing.
func parseSecretLayout(s *corev1.Secret, layout SecretLayout) (st *caSet, convert bool, err error) {
	switch layout {
	case LayoutCertController:
		if certControllerLayout(s) {
			st, err = parseCertControllerSecret(s)
			return st, true, err
		}
	case LayoutKnative:
		if len(s.Data[corev1.TLSCertKey]) == 0 && hasKnativeKeys(s) {
			st, err = parseKnativeSecret(s)
			// Adopted, and written back, until ca.crt (which only the
			// Authority writes) holds knative's CA: a rewrite by knative's
			// reconciler after the Authority's first write puts a CA in
			// ca-cert.pem that ca.crt lacks (foreignWriter holds it).
			return st, err == nil && !knativeCAPublished(s, st.signing.Cert), err
		}
	case LayoutCertManager:
		st, err = parseAuthoritySecret(s)
		if err == nil && st.signing != nil && !containsCert(st.bundle, st.signing.Cert) {
			err = fmt.Errorf("%s does not hold the CA in %s (cert-manager writes the same CA to both)", dynamiccert.SecretCAKey, corev1.TLSCertKey)
		}
		return st, false, err
	case LayoutEvercert:
		if len(s.Data[corev1.TLSCertKey]) == 0 && hasKnativeKeys(s) {
			// Taken for an empty Secret, it would get a new CA that no
			// client trusts.
			return nil, false, fmt.Errorf("holds knative's layout (%s, %s, %s); set AuthorityConfig.Adopt to %q to adopt it",
				knativeCACertKey, knativeServerCertKey, knativeServerKeyKey, LayoutKnative)
		}
		st, err = parseAuthoritySecret(s)
		if _, cc := s.Data[certControllerCAKeyKey]; err != nil && cc {
			if broken, ok := err.(*brokenSecretError); ok {
				broken.foreign = certControllerCAKeyKey // not ours to write back
			}
			err = fmt.Errorf("%w (the Secret has %s: cert-controller's layout? set AuthorityConfig.Adopt to %q to adopt it)", err, certControllerCAKeyKey, LayoutCertController)
		}
		return st, false, err
	}
	st, err = parseAuthoritySecret(s)
	return st, false, err
}

// certControllerLayout reports whether s is still in cert-controller's
// layout: it has data and either cert-controller's CA key or no CA in
// tls.crt (a half-written Secret then fails naming the missing key). An
// empty Secret is an empty state, as in the Authority's layout.
func certControllerLayout(s *corev1.Secret) bool {
	if len(s.Data) == 0 {
		return false
	}
	if _, ok := s.Data[certControllerCAKeyKey]; ok {
		return true
	}
	certs, err := pki.ParseCABundle(s.Data[corev1.TLSCertKey])
	return err != nil || len(certs) == 0 || !certs[0].IsCA
}

// knativeCAPublished reports whether the ca.crt of s holds ca, knative's
// CA: false before the Authority's first write, and after knative's
// reconciler wrote a new CA over the one the Authority published.
func knativeCAPublished(s *corev1.Secret, ca *x509.Certificate) bool {
	certs, err := pki.ParseCABundle(s.Data[dynamiccert.SecretCAKey])
	return err == nil && containsCert(certs, ca)
}

func hasKnativeKeys(s *corev1.Secret) bool {
	for _, k := range []string{knativeCACertKey, knativeServerCertKey, knativeServerKeyKey} {
		if _, ok := s.Data[k]; ok {
			return true
		}
	}
	return false
}

func requireKeys(s *corev1.Secret, layout SecretLayout, keys ...string) error {
	for _, k := range keys {
		if len(s.Data[k]) == 0 {
			return fmt.Errorf("%s layout: key %s is missing or empty", layout, k)
		}
	}
	return nil
}

// parseCertControllerSecret reads cert-controller's layout: the CA with its
// key, and a serving leaf that must be the CA's (cert-controller serves it
// today; a leaf the CA did not sign means the Secret is not what the
// webhook configurations trust).
func parseCertControllerSecret(s *corev1.Secret) (*caSet, error) {
	if err := requireKeys(s, LayoutCertController, dynamiccert.SecretCAKey, certControllerCAKeyKey, corev1.TLSCertKey, corev1.TLSPrivateKeyKey); err != nil {
		return nil, err
	}
	ca, err := costly.parseCA(s.Data[dynamiccert.SecretCAKey], s.Data[certControllerCAKeyKey])
	if err != nil {
		return nil, fmt.Errorf("%s layout: CA (%s, %s): %w", LayoutCertController, dynamiccert.SecretCAKey, certControllerCAKeyKey, err)
	}
	if _, err := parseForeignLeaf(s, LayoutCertController, corev1.TLSCertKey, corev1.TLSPrivateKeyKey, ca.Cert); err != nil {
		return nil, err
	}
	return &caSet{signing: ca, bundle: []*x509.Certificate{ca.Cert}}, nil
}

// parseKnativeSecret reads knative's layout, or the Authority's state while
// it still serves knative's leaf: the CA without its key (it cannot sign),
// knative's leaf, and the successor and bundle the Authority wrote beside
// them.
func parseKnativeSecret(s *corev1.Secret) (*caSet, error) {
	if err := requireKeys(s, LayoutKnative, knativeCACertKey, knativeServerCertKey, knativeServerKeyKey); err != nil {
		return nil, err
	}
	certs, err := pki.ParseCABundle(s.Data[knativeCACertKey])
	if err != nil {
		return nil, fmt.Errorf("%s layout: %s: %w", LayoutKnative, knativeCACertKey, err)
	}
	if len(certs) != 1 || !certs[0].IsCA {
		return nil, fmt.Errorf("%s layout: %s must hold exactly one CA certificate", LayoutKnative, knativeCACertKey)
	}
	ca := &pki.Issued{Cert: certs[0], CertPEM: s.Data[knativeCACertKey]} // no key: knative does not store it
	leaf, err := parseForeignLeaf(s, LayoutKnative, knativeServerCertKey, knativeServerKeyKey, ca.Cert)
	if err != nil {
		return nil, err
	}
	st := &caSet{signing: ca, legacy: leaf}
	if err := parseSuccessorAndBundle(s, st); err != nil {
		return nil, err
	}
	if !containsCert(st.bundle, ca.Cert) {
		// Nothing clients trust today is dropped.
		st.bundle = append([]*x509.Certificate{ca.Cert}, st.bundle...)
	}
	return st, nil
}

// parseForeignLeaf reads the other tool's serving leaf and checks that ca
// signed it.
func parseForeignLeaf(s *corev1.Secret, layout SecretLayout, certKey, keyKey string, ca *x509.Certificate) (*pki.Issued, error) {
	pair, err := pki.ParseCertKey(s.Data[certKey], s.Data[keyKey], zeroTime)
	if err != nil {
		return nil, fmt.Errorf("%s layout: serving certificate (%s, %s): %w", layout, certKey, keyKey, err)
	}
	if err := pair.Leaf.CheckSignatureFrom(ca); err != nil {
		return nil, fmt.Errorf("%s layout: serving certificate %s is not signed by the CA %q: %w", layout, certKey, ca.Subject.CommonName, err)
	}
	key, ok := pair.TLS.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s layout: %s: unsupported private key type %T", layout, keyKey, pair.TLS.PrivateKey)
	}
	return &pki.Issued{Cert: pair.Leaf, Key: key, CertPEM: s.Data[certKey], KeyPEM: s.Data[keyKey]}, nil
}

func containsCert(certs []*x509.Certificate, c *x509.Certificate) bool {
	for _, b := range certs {
		if b.Equal(c) {
			return true
		}
	}
	return false
}

// removeForeignKeys drops the other tool's keys once the Secret holds the
// Authority's layout: cert-controller's CA key (now in tls.key), and
// knative's CA and leaf once a CA with a key signs (knative's CA stays in
// ca.crt until it expires).
func removeForeignKeys(s *corev1.Secret, layout SecretLayout) {
	switch layout {
	case LayoutCertController:
		delete(s.Data, certControllerCAKeyKey)
	case LayoutKnative:
		delete(s.Data, knativeCACertKey)
		delete(s.Data, knativeServerCertKey)
		delete(s.Data, knativeServerKeyKey)
	}
}
