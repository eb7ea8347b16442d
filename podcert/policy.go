package podcert

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// DNSNamesAnnotation is the one key of a request's
// spec.unverifiedUserAnnotations (the podCertificate projection's
// userAnnotations) the signer understands: a comma-separated list of DNS
// names the pod asks for. Each must be granted by the Policy; the
// certificate then carries exactly these names instead of every granted
// one. Any other key is denied (InvalidUnverifiedUserAnnotations), as the
// PodCertificateRequest API asks of signers.
const DNSNamesAnnotation = "evercert.io/dns-names"

// DefaultClusterDomain is the cluster's DNS domain when Policy.ClusterDomain
// is empty.
const DefaultClusterDomain = "cluster.local"

// AnyNamespace as a Rule's Namespace matches every namespace.
const AnyNamespace = "*"

// Policy says which pods get a certificate from the signer, and for which
// DNS names. A request is allowed when at least one Rule matches its
// namespace and service account; the names granted are the union of what
// the matching rules grant. Anything else is denied. The zero Policy allows
// nothing; Validate refuses it.
//
// A Policy is plain data (JSON or YAML through ParsePolicy) and is not
// modified by the signer.
type Policy struct {
	// Rules grant names to pods; see Rule.
	Rules []Rule `json:"rules"`
	// ClusterDomain is the cluster's DNS domain, for the
	// <service>.<namespace>.svc.<ClusterDomain> names of
	// Rule.ServiceNames. Default DefaultClusterDomain.
	ClusterDomain string `json:"clusterDomain,omitempty"`
}

// Rule grants DNS names to the pods of some service accounts in a
// namespace.
type Rule struct {
	// Namespace is the namespace of the pods, or AnyNamespace. Required.
	Namespace string `json:"namespace"`
	// ServiceAccounts are the names of the service accounts the pods run
	// as; empty means any service account in Namespace.
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
	// ServiceNames grants <service>.<namespace>.svc and
	// <service>.<namespace>.svc.<ClusterDomain> for every Service in the
	// pod's namespace whose selector selects the pod, as the signer reads
	// the Pod and the Services from the API server when it signs.
	ServiceNames bool `json:"serviceNames,omitempty"`
	// DNSNames are granted as they are: DNS names, or wildcards
	// ("*.example.com").
	DNSNames []string `json:"dnsNames,omitempty"`
}

// ParsePolicy reads a Policy from YAML or JSON. Unknown fields are errors,
// so a misspelt field is not silently ignored; the Policy is validated.
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return Policy{}, fmt.Errorf("parsing policy: %w", err)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// Validate returns every problem of the policy, each naming its field
// (e.g. "rules[1].dnsNames[0]").
func (p *Policy) Validate() error {
	var errs []error
	if len(p.Rules) == 0 {
		errs = append(errs, errors.New("policy.rules: at least one rule is required (a signer that denies everything is a mistake)"))
	}
	if p.ClusterDomain != "" {
		if msgs := validation.IsDNS1123Subdomain(p.ClusterDomain); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("policy.clusterDomain: %q: %s", p.ClusterDomain, strings.Join(msgs, "; ")))
		}
	}
	for i, r := range p.Rules {
		field := fmt.Sprintf("policy.rules[%d]", i)
		switch {
		case r.Namespace == "":
			errs = append(errs, fmt.Errorf("%s.namespace: required (%q for any namespace)", field, AnyNamespace))
		case r.Namespace != AnyNamespace:
			if msgs := validation.IsDNS1123Label(r.Namespace); len(msgs) > 0 {
				errs = append(errs, fmt.Errorf("%s.namespace: %q: %s", field, r.Namespace, strings.Join(msgs, "; ")))
			}
		}
		for j, sa := range r.ServiceAccounts {
			if msgs := validation.IsDNS1123Subdomain(sa); len(msgs) > 0 {
				errs = append(errs, fmt.Errorf("%s.serviceAccounts[%d]: %q: %s", field, j, sa, strings.Join(msgs, "; ")))
			}
		}
		for j, name := range r.DNSNames {
			if err := checkDNSName(name); err != nil {
				errs = append(errs, fmt.Errorf("%s.dnsNames[%d]: %w", field, j, err))
			}
		}
		if !r.ServiceNames && len(r.DNSNames) == 0 {
			errs = append(errs, fmt.Errorf("%s: grants no name: set serviceNames or dnsNames", field))
		}
	}
	return errors.Join(errs...)
}

func (p *Policy) clusterDomain() string {
	if p.ClusterDomain == "" {
		return DefaultClusterDomain
	}
	return p.ClusterDomain
}

// matching returns the rules that match a pod in namespace running as
// serviceAccount.
func (p *Policy) matching(namespace, serviceAccount string) []Rule {
	var out []Rule
	for _, r := range p.Rules {
		if (r.Namespace == AnyNamespace || r.Namespace == namespace) &&
			(len(r.ServiceAccounts) == 0 || slices.Contains(r.ServiceAccounts, serviceAccount)) {
			out = append(out, r)
		}
	}
	return out
}

// serviceNames returns the names of the Services among services that select
// pod: <svc>.<ns>.svc and <svc>.<ns>.svc.<domain>. A Service without a
// selector selects nothing (its endpoints are managed by hand), nor does an
// ExternalName Service (its name points elsewhere).
func serviceNames(pod *corev1.Pod, services []corev1.Service, domain string) []string {
	var out []string
	for _, svc := range services {
		if len(svc.Spec.Selector) == 0 || svc.Namespace != pod.Namespace || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			base := svc.Name + "." + svc.Namespace + ".svc"
			out = append(out, base, base+"."+domain)
		}
	}
	return out
}

// requestedNames parses DNSNamesAnnotation; nil when it is absent.
func requestedNames(annotations map[string]string) ([]string, error) {
	for k := range annotations {
		if k != DNSNamesAnnotation {
			return nil, fmt.Errorf("unknown key %q in unverifiedUserAnnotations: this signer understands only %q", k, DNSNamesAnnotation)
		}
	}
	v, ok := annotations[DNSNamesAnnotation]
	if !ok {
		return nil, nil
	}
	var names []string
	for n := range strings.SplitSeq(v, ",") {
		n = strings.TrimSpace(n)
		if err := checkDNSName(n); err != nil {
			return nil, fmt.Errorf("%s: %w", DNSNamesAnnotation, err)
		}
		names = append(names, n)
	}
	return names, nil
}

// checkDNSName accepts a DNS name or a single-label wildcard.
func checkDNSName(name string) error {
	if name == "" {
		return errors.New("empty DNS name")
	}
	var msgs []string
	if strings.HasPrefix(name, "*.") {
		msgs = validation.IsWildcardDNS1123Subdomain(name)
	} else {
		msgs = validation.IsDNS1123Subdomain(name)
	}
	if len(msgs) > 0 {
		return fmt.Errorf("%q: %s", name, strings.Join(msgs, "; "))
	}
	return nil
}
