package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/pki"
)

// targetFlags name the objects whose caBundle clients of the Authority's
// servers use.
type targetFlags struct {
	webhooks, apiServices, crds, clusterTrustBundles []string
}

func (t *targetFlags) add(fs *pflag.FlagSet) {
	fs.StringArrayVar(&t.webhooks, "webhook", nil, "a webhook configuration whose caBundles to check: validating/NAME or mutating/NAME (repeatable)")
	fs.StringArrayVar(&t.apiServices, "apiservice", nil, "an APIService whose caBundle to check (repeatable)")
	fs.StringArrayVar(&t.crds, "crd", nil, "a CustomResourceDefinition whose conversion webhook caBundle to check (repeatable)")
	fs.StringArrayVar(&t.clusterTrustBundles, "cluster-trust-bundle", nil, "a ClusterTrustBundle to check (repeatable)")
}

// target is one object holding CA bundles.
type target struct {
	kind, name string
}

func (t target) String() string { return t.kind + "/" + t.name }

// parseWebhook reads a --webhook value.
func parseWebhook(v string) (target, error) {
	kind, name, ok := strings.Cut(v, "/")
	if !ok || name == "" || strings.Contains(name, "/") || (kind != "validating" && kind != "mutating") {
		return target{}, usagef("--webhook %q: want validating/NAME or mutating/NAME", v)
	}
	return target{kind: kind, name: name}, nil
}

// list checks the flags and returns the targets in flag order, by kind.
func (t *targetFlags) list() ([]target, error) {
	var out []target
	for _, v := range t.webhooks {
		tg, err := parseWebhook(v)
		if err != nil {
			return nil, err
		}
		out = append(out, tg)
	}
	for flag, names := range map[string][]string{"apiservice": t.apiServices, "crd": t.crds, "cluster-trust-bundle": t.clusterTrustBundles} {
		for _, n := range names {
			if n == "" || strings.Contains(n, "/") {
				return nil, usagef("--%s %q: want a NAME", flag, n)
			}
		}
	}
	for _, n := range t.apiServices {
		out = append(out, target{kind: "apiservice", name: n})
	}
	for _, n := range t.crds {
		out = append(out, target{kind: "crd", name: n})
	}
	for _, n := range t.clusterTrustBundles {
		out = append(out, target{kind: "clustertrustbundle", name: n})
	}
	return out, nil
}

// field is one CA bundle of a target: a webhook configuration has one per
// webhook.
type field struct {
	path   string
	bundle []byte
}

// errTargetNotFound marks a target that does not exist: a finding, not an
// API failure.
var errTargetNotFound = errors.New("not found")

// bundles reads the target's CA bundles from the API server.
func (k *kube) bundles(ctx context.Context, t target) ([]field, error) {
	var fields []field
	var err error
	switch t.kind {
	case "validating":
		c, e := k.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, t.name, metav1.GetOptions{})
		if err = e; err == nil {
			for _, w := range c.Webhooks {
				fields = append(fields, field{path: "webhooks[" + w.Name + "].clientConfig.caBundle", bundle: w.ClientConfig.CABundle})
			}
		}
	case "mutating":
		c, e := k.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, t.name, metav1.GetOptions{})
		if err = e; err == nil {
			for _, w := range c.Webhooks {
				fields = append(fields, field{path: "webhooks[" + w.Name + "].clientConfig.caBundle", bundle: w.ClientConfig.CABundle})
			}
		}
	case "apiservice":
		var agg aggregatorclient.Interface
		if agg, err = aggregatorclient.NewForConfig(k.config); err != nil {
			return nil, fmt.Errorf("%s: making a client: %w", t, err)
		}
		a, e := agg.ApiregistrationV1().APIServices().Get(ctx, t.name, metav1.GetOptions{})
		if err = e; err == nil {
			fields = append(fields, field{path: "spec.caBundle", bundle: a.Spec.CABundle})
		}
	case "crd":
		var ext apiextensionsclient.Interface
		if ext, err = apiextensionsclient.NewForConfig(k.config); err != nil {
			return nil, fmt.Errorf("%s: making a client: %w", t, err)
		}
		c, e := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, t.name, metav1.GetOptions{})
		if err = e; err == nil {
			var b []byte
			if cv := c.Spec.Conversion; cv != nil && cv.Webhook != nil && cv.Webhook.ClientConfig != nil {
				b = cv.Webhook.ClientConfig.CABundle
			}
			fields = append(fields, field{path: "spec.conversion.webhook.clientConfig.caBundle", bundle: b})
		}
	case "clustertrustbundle":
		c, e := k.client.CertificatesV1().ClusterTrustBundles().Get(ctx, t.name, metav1.GetOptions{})
		if err = e; err == nil {
			fields = append(fields, field{path: "spec.trustBundle", bundle: []byte(c.Spec.TrustBundle)})
		}
	default:
		return nil, fmt.Errorf("unknown target kind %q", t.kind)
	}
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%s: %w", t, errTargetNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", t, err)
	}
	return fields, nil
}

// caInfo describes a CA certificate.
type caInfo struct {
	Subject     string    `json:"subject"`
	Fingerprint string    `json:"fingerprint"`
	Serial      string    `json:"serial"`
	NotBefore   time.Time `json:"notBefore"`
	NotAfter    time.Time `json:"notAfter"`
}

func describeCA(c *x509.Certificate) caInfo {
	return caInfo{
		Subject: c.Subject.String(), Fingerprint: authority.Fingerprint(c), Serial: c.SerialNumber.Text(16),
		NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC(),
	}
}

// verifyChain verifies leaf (with intermediates, as a server sends them)
// against the roots of bundle at now, for TLS server use, and returns the
// root it chains to. serverName, when set, must be a name of the leaf.
func verifyChain(leaf *x509.Certificate, intermediates []*x509.Certificate, bundle []byte, serverName string, now time.Time) (*x509.Certificate, error) {
	if len(bundle) == 0 {
		return nil, errors.New("the CA bundle is empty")
	}
	pool, _, err := pki.NewPool(bundle)
	if err != nil {
		return nil, fmt.Errorf("the CA bundle does not parse: %w", err)
	}
	inter := x509.NewCertPool()
	for _, c := range intermediates {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: inter, DNSName: serverName, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	chain := chains[0]
	return chain[len(chain)-1], nil
}

// parseCertPEM reads the first certificate of a PEM text; nil if there is
// none.
func parseCertPEM(data []byte) *x509.Certificate {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	return c
}
