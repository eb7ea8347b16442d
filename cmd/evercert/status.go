package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// statusReport is what `status` prints (-o json: this structure).
type statusReport struct {
	Secret string `json:"secret"`
	// Now is this tool's clock, which replica liveness is judged on.
	Now       time.Time      `json:"now"`
	Signing   *caInfo        `json:"signing,omitempty"`
	Successor *successorInfo `json:"successor,omitempty"`
	Bundle    []caInfo       `json:"bundle"`
	Requests  []requestInfo  `json:"operatorRequests"`
	Replicas  []replica      `json:"replicas"`
	Targets   []targetReport `json:"targets"`
	// Healthy is false when Problems is not empty (exit code 3).
	Healthy  bool     `json:"healthy"`
	Problems []string `json:"problems"`
}

// successorInfo is the published successor CA and where it stands.
type successorInfo struct {
	caInfo
	PublishedAt *time.Time `json:"publishedAt,omitempty"`
	// PendingObservers are the live replicas whose Lease does not trust
	// the successor yet (believed announcements only).
	PendingObservers []string `json:"pendingObservers"`
}

// requestInfo is an operator request on the Secret and whether the
// Authority recorded that it acted on it.
type requestInfo struct {
	Annotation string `json:"annotation"`
	Value      string `json:"value"`
	Reason     string `json:"reason,omitempty"`
	At         string `json:"at,omitempty"`
	Handled    bool   `json:"handled"`
}

// targetReport is whether a caBundle target verifies each live replica's
// served leaf.
type targetReport struct {
	Target   string          `json:"target"`
	Error    string          `json:"error,omitempty"`
	Verifies bool            `json:"verifies"`
	Replicas []targetReplica `json:"replicas"`
}

type targetReplica struct {
	Replica  string `json:"replica"`
	Field    string `json:"field"`
	Verifies bool   `json:"verifies"`
	Error    string `json:"error,omitempty"`
	// CA is the Fingerprint of the bundle's CA the leaf chains to.
	CA string `json:"ca,omitempty"`
}

func runStatus(prog string, args []string, stdout io.Writer) error {
	var common commonFlags
	var targets targetFlags
	var hosts []string
	timeout := 30 * time.Second
	fs := newFlagSet(prog, "status", "<ca-secret> [flags]", &common)
	targets.add(fs)
	fs.StringSliceVar(&hosts, "hosts", nil, "the Authority's host names and IPs (its --self-signed-hosts / AuthorityConfig.Hosts): a Lease announcing a leaf for other names is rejected, as the Authority rejects it")
	fs.DurationVar(&timeout, "timeout", timeout, "how long the API requests may take in all")
	pos, err := parse(fs, &common, args, 1)
	if err != nil {
		return err
	}
	list, err := targets.list()
	if err != nil {
		return err
	}
	k, err := common.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rep, err := k.status(ctx, pos[0], list, hosts, time.Now())
	if err != nil {
		return err
	}
	if common.output == "json" {
		err = printJSON(stdout, rep)
	} else {
		err = printStatus(stdout, rep)
	}
	if err != nil {
		return err
	}
	if !rep.Healthy {
		return failedf("not healthy: %s", strings.Join(rep.Problems, "; "))
	}
	return nil
}

// status gathers the report: the Secret, the Leases (verified against the
// Secret's CAs and, when given, the Authority's hosts), the targets.
func (k *kube) status(ctx context.Context, name string, targets []target, hosts []string, now time.Time) (*statusReport, error) {
	secret, err := k.client.CoreV1().Secrets(k.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the CA Secret %s/%s: %w", k.namespace, name, err)
	}
	rep := &statusReport{Secret: k.namespace + "/" + name, Now: now.UTC(), Bundle: []caInfo{}, Requests: []requestInfo{},
		Targets: []targetReport{}, Problems: []string{}}
	problem := func(format string, args ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...)) }

	var cas []*x509.Certificate // every CA the Secret holds, signing first
	signing := parseCertPEM(secret.Data[corev1.TLSCertKey])
	if signing != nil {
		ci := describeCA(signing)
		rep.Signing = &ci
		cas = append(cas, signing)
	} else {
		problem("the Secret holds no signing CA in %s", corev1.TLSCertKey)
	}
	successor := parseCertPEM(secret.Data[authority.NextCertKey])
	if successor != nil {
		cas = append(cas, successor)
	}
	if b := secret.Data[dynamiccert.SecretCAKey]; len(b) > 0 {
		bundle, err := pki.ParseCABundle(b)
		if err != nil {
			problem("the Secret's %s does not parse: %v", dynamiccert.SecretCAKey, err)
		}
		for _, c := range bundle {
			rep.Bundle = append(rep.Bundle, describeCA(c))
			cas = append(cas, c)
		}
	}
	rep.Requests = operatorRequests(secret.Annotations)

	if rep.Replicas, err = k.replicas(ctx, name, now, cas, hosts, authority.ReplicaNames(secret)); err != nil {
		return nil, err
	}
	names := map[string][]string{} // the believed replicas by the names of their leaves
	for i := range rep.Replicas {
		r := &rep.Replicas[i]
		r.LeafCA = issuer(r.leaf, cas)
		if r.Live && r.Rejection != nil {
			// Not a replica the Authority waits for: a forgery, a holder
			// of another leaf of the CA, or a release that does not sign.
			problem("Lease %s (holder %s) is not believed (%s): %s", r.Lease, r.ID, r.Rejection.Reason, r.Rejection.Message)
		}
		if r.believed() && len(hosts) == 0 {
			n := canonicalNames(r.LeafNames)
			names[n] = append(names[n], r.ID)
		}
	}
	if len(names) > 1 {
		// Every replica of one Authority issues its leaves for the same
		// names; without --hosts this tool cannot tell which are the
		// Authority's and which another leaf of its CA (podcert, SignLeaf).
		var groups []string
		for n, ids := range names {
			groups = append(groups, fmt.Sprintf("%s for %s", strings.Join(ids, ", "), n))
		}
		slices.Sort(groups)
		problem("the live replicas' leaves are for different names (%s): a leaf the CA signed for someone else may be announcing; run again with --hosts to check against the Authority's names", strings.Join(groups, "; "))
	}
	if successor != nil {
		s := &successorInfo{caInfo: describeCA(successor), PendingObservers: []string{}}
		if t, err := time.Parse(time.RFC3339, secret.Annotations[authority.NextSinceAnnotation]); err == nil {
			t = t.UTC()
			s.PublishedAt = &t
		}
		for _, r := range rep.Replicas {
			if r.believed() && !slices.Contains(r.TrustedCAs, s.Fingerprint) {
				s.PendingObservers = append(s.PendingObservers, r.ID)
			}
		}
		rep.Successor = s
	}

	for _, t := range targets {
		tr := targetReport{Target: t.String(), Replicas: []targetReplica{}}
		fields, err := k.bundles(ctx, t)
		switch {
		case errors.Is(err, errTargetNotFound):
			tr.Error = errTargetNotFound.Error()
		case err != nil:
			return nil, err
		case len(fields) == 0:
			tr.Error = "holds no caBundle field"
		}
		tr.Verifies = tr.Error == ""
		for _, r := range rep.Replicas {
			if !r.believed() {
				continue
			}
			for _, f := range fields {
				v := targetReplica{Replica: r.ID, Field: f.path}
				if root, err := verifyChain(r.leaf, nil, f.bundle, "", now); err != nil {
					v.Error = err.Error()
				} else {
					v.Verifies, v.CA = true, authority.Fingerprint(root)
				}
				tr.Verifies = tr.Verifies && v.Verifies
				tr.Replicas = append(tr.Replicas, v)
			}
		}
		if tr.Error != "" {
			problem("%s: %s", tr.Target, tr.Error)
		} else if !tr.Verifies {
			problem("%s does not verify every live replica's leaf", tr.Target)
		}
		rep.Targets = append(rep.Targets, tr)
	}
	rep.Healthy = len(rep.Problems) == 0
	return rep, nil
}

// operatorRequests lists the operator annotations on the Secret.
func operatorRequests(ann map[string]string) []requestInfo {
	out := []requestInfo{}
	if v := ann[authority.RotateRequestedAnnotation]; v != "" {
		out = append(out, requestInfo{Annotation: authority.RotateRequestedAnnotation, Value: v,
			Handled: ann[authority.RotateHandledAnnotation] == v})
	}
	if v := ann[authority.CompromisedCAAnnotation]; v != "" {
		out = append(out, requestInfo{Annotation: authority.CompromisedCAAnnotation, Value: v,
			Reason: ann[authority.CompromisedReasonAnnotation], At: ann[authority.CompromisedAtAnnotation],
			Handled: ann[authority.CompromisedHandledAnnotation] == v})
	}
	return out
}

func printStatus(w io.Writer, rep *statusReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }
	ca := func(c caInfo) string {
		return fmt.Sprintf("%s\tfingerprint %s\tvalid %s to %s", c.Subject, c.Fingerprint,
			c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339))
	}
	p("CA Secret:\t%s\n", rep.Secret)
	if rep.Signing != nil {
		p("Signing CA:\t%s\n", ca(*rep.Signing))
	} else {
		p("Signing CA:\tnone\n")
	}
	if s := rep.Successor; s != nil {
		p("Successor CA:\t%s\n", ca(s.caInfo))
		published := "unknown"
		if s.PublishedAt != nil {
			published = s.PublishedAt.Format(time.RFC3339)
		}
		pending := "none"
		if len(s.PendingObservers) > 0 {
			pending = strings.Join(s.PendingObservers, ", ")
		}
		p("  published at:\t%s\n  pending observers:\t%s\n", published, pending)
	} else {
		p("Successor CA:\tnone\n")
	}
	p("Trusted (ca.crt):\t%d CA(s)\n", len(rep.Bundle))
	for _, c := range rep.Bundle {
		p("  -\t%s\n", ca(c))
	}
	for _, r := range rep.Requests {
		state := "not handled yet"
		if r.Handled {
			state = "handled"
		}
		extra := ""
		if r.Reason != "" {
			extra = fmt.Sprintf(" (reason %q, at %s)", r.Reason, r.At)
		}
		p("Operator request:\t%s=%s%s: %s\n", r.Annotation, r.Value, extra, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nReplicas (live judged on this machine's clock, %s):\n", rep.Now.Format(time.RFC3339))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p("REPLICA\tLIVE\tANNOUNCEMENT\tRENEWED\tLEAF SERIAL\tLEAF CA\tTRUSTED CAS\n")
	var rejected []replica
	for _, r := range rep.Replicas {
		renewed := "-"
		if r.RenewTime != nil {
			renewed = r.RenewTime.Format(time.RFC3339)
		}
		announcement := "verified"
		if r.Rejection != nil {
			announcement = "REJECTED (" + r.Rejection.Reason + ")"
			rejected = append(rejected, r)
		}
		p("%s\t%v\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Live, announcement, renewed, dash(r.LeafSerial), dash(r.LeafCA), dash(strings.Join(r.TrustedCAs, ",")))
	}
	if len(rep.Replicas) == 0 {
		p("(no replica Leases)\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rejected) > 0 {
		fmt.Fprintf(w, "\nRejected announcements (the Authority does not believe them either; not counted as replicas):\n")
		for _, r := range rejected {
			fmt.Fprintf(w, "  - Lease %s (holder %s): %s: %s\n", r.Lease, r.ID, r.Rejection.Reason, r.Rejection.Message)
		}
	}
	if len(rep.Targets) > 0 {
		fmt.Fprintf(w, "\nTargets:\n")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, t := range rep.Targets {
			state := "verifies every live replica's leaf"
			switch {
			case t.Error != "":
				state = t.Error
			case !t.Verifies:
				state = "DOES NOT verify every live replica's leaf"
			}
			p("%s\t%s\n", t.Target, state)
			for _, r := range t.Replicas {
				if r.Verifies {
					p("  %s\t%s\tok (CA %s)\n", r.Replica, r.Field, r.CA)
				} else {
					p("  %s\t%s\tFAILS: %s\n", r.Replica, r.Field, r.Error)
				}
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if rep.Healthy {
		fmt.Fprintf(w, "\nHealthy.\n")
	} else {
		fmt.Fprintf(w, "\nNot healthy:\n")
		for _, pr := range rep.Problems {
			fmt.Fprintf(w, "  - %s\n", pr)
		}
	}
	return nil
}

// canonicalNames is one form of a leaf's names for comparing them: sorted,
// lower-cased.
func canonicalNames(names []string) string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, strings.ToLower(n))
	}
	slices.Sort(out)
	return "[" + strings.Join(out, " ") + "]"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
