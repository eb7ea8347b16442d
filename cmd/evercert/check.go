package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// checkReport is what `check` prints (-o json: this structure).
type checkReport struct {
	Address    string `json:"address"`
	ServerName string `json:"serverName,omitempty"`
	// Against names the bundle verified against.
	Against string `json:"against"`
	Leaf    struct {
		Subject  string    `json:"subject"`
		Serial   string    `json:"serial"`
		DNSNames []string  `json:"dnsNames,omitempty"`
		NotAfter time.Time `json:"notAfter"`
	} `json:"leaf"`
	Verified bool `json:"verified"`
	// Errors are the verification failures, one per bundle that failed.
	Errors []string `json:"errors"`
	// CA is the root the chain verified to.
	CA *caInfo `json:"ca,omitempty"`
	// Replica is the Authority replica whose Lease announces the served
	// leaf (with --authority); empty if none does.
	Replica string `json:"replica,omitempty"`
}

func runCheck(prog string, args []string, stdout io.Writer) error {
	var common commonFlags
	var serverName, webhook, ctb, caFile, authority string
	timeout := 30 * time.Second
	fs := newFlagSet(prog, "check", "<host:port> (--webhook KIND/NAME | --cluster-trust-bundle NAME | --ca-file PATH) [flags]", &common)
	fs.StringVar(&serverName, "server-name", "", "the TLS server name (SNI) to ask for; when set, the leaf must also be valid for it")
	fs.StringVar(&webhook, "webhook", "", "verify against this webhook configuration's caBundles: validating/NAME or mutating/NAME (every webhook's)")
	fs.StringVar(&ctb, "cluster-trust-bundle", "", "verify against this ClusterTrustBundle")
	fs.StringVar(&caFile, "ca-file", "", "verify against the PEM CA bundle in this file")
	fs.StringVar(&authority, "authority", "", "the Authority's CA Secret (in --namespace): name the replica whose Lease announces the served leaf")
	fs.DurationVar(&timeout, "timeout", timeout, "how long the command may take")
	pos, err := parse(fs, &common, args, 1)
	if err != nil {
		return err
	}
	addr := pos[0]
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usagef("address %q: want host:port (%v)", addr, err)
	}
	sources := 0
	for _, s := range []string{webhook, ctb, caFile} {
		if s != "" {
			sources++
		}
	}
	if sources != 1 {
		return usagef("give exactly one of --webhook, --cluster-trust-bundle and --ca-file")
	}
	var wh target
	if webhook != "" {
		if wh, err = parseWebhook(webhook); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	var k *kube
	if webhook != "" || ctb != "" || authority != "" {
		if k, err = common.connect(); err != nil {
			return err
		}
	}
	rep := &checkReport{Address: addr, ServerName: serverName, Errors: []string{}}
	var fields []field
	switch {
	case caFile != "":
		data, err := os.ReadFile(caFile)
		if err != nil {
			return fmt.Errorf("--ca-file: %w", err)
		}
		rep.Against = "file " + caFile
		fields = []field{{path: "the file", bundle: data}}
	case webhook != "":
		rep.Against = wh.String()
		if fields, err = k.bundles(ctx, wh); err != nil {
			return err
		}
	default:
		t := target{kind: "clustertrustbundle", name: ctb}
		rep.Against = t.String()
		if fields, err = k.bundles(ctx, t); err != nil {
			return err
		}
	}
	if len(fields) == 0 {
		return failedf("%s holds no CA bundle", rep.Against)
	}

	certs, err := handshake(ctx, addr, serverName)
	if err != nil {
		return err
	}
	leaf := certs[0]
	rep.Leaf.Subject, rep.Leaf.Serial, rep.Leaf.DNSNames, rep.Leaf.NotAfter = leaf.Subject.String(), leaf.SerialNumber.Text(16), leaf.DNSNames, leaf.NotAfter.UTC()
	now := time.Now()
	rep.Verified = true
	for _, f := range fields {
		root, err := verifyChain(leaf, certs[1:], f.bundle, serverName, now)
		if err != nil {
			rep.Verified = false
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", f.path, err))
			continue
		}
		if rep.CA == nil {
			ci := describeCA(root)
			rep.CA = &ci
		}
	}
	if !rep.Verified {
		rep.CA = nil
	}
	if authority != "" {
		secret, err := k.client.CoreV1().Secrets(k.namespace).Get(ctx, authority, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("--authority: reading the CA Secret %s/%s: %w", k.namespace, authority, err)
		}
		replicas, err := k.replicas(ctx, authority, now, secretCAs(secret), nil, nil)
		if err != nil {
			return err
		}
		for _, r := range replicas {
			// Only a verified announcement names a replica: anyone who may
			// write Leases can copy a served leaf into one.
			if r.Verified && r.leaf.Equal(leaf) {
				rep.Replica = r.ID
				break
			}
		}
	}

	if common.output == "json" {
		err = printJSON(stdout, rep)
	} else {
		err = printCheck(stdout, rep, authority)
	}
	if err != nil {
		return err
	}
	if !rep.Verified {
		return failedf("%s does not verify against %s: %s", addr, rep.Against, strings.Join(rep.Errors, "; "))
	}
	return nil
}

// handshake connects to addr and returns the certificates the server
// sent. Verification is done afterwards, against the bundle asked for, so
// that a failure can be reported with what was served.
func handshake(ctx context.Context, addr, serverName string) ([]*x509.Certificate, error) {
	d := &tls.Dialer{Config: &tls.Config{
		ServerName: serverName,
		// Verified by the caller against the chosen bundle (verifyChain).
		InsecureSkipVerify: true, //nolint:gosec
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
	}
	defer conn.Close()
	certs := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, failedf("the server at %s sent no certificate to verify", addr)
	}
	return certs, nil
}

func printCheck(w io.Writer, rep *checkReport, authority string) error {
	fmt.Fprintf(w, "Address:\t%s\n", rep.Address)
	if rep.ServerName != "" {
		fmt.Fprintf(w, "Server name:\t%s\n", rep.ServerName)
	}
	fmt.Fprintf(w, "Served leaf:\t%s, serial %s, names %s, expires %s\n", rep.Leaf.Subject, rep.Leaf.Serial,
		strings.Join(rep.Leaf.DNSNames, ","), rep.Leaf.NotAfter.Format(time.RFC3339))
	if rep.Verified {
		fmt.Fprintf(w, "Verified against %s by CA %s (fingerprint %s)\n", rep.Against, rep.CA.Subject, rep.CA.Fingerprint)
	} else {
		fmt.Fprintf(w, "NOT verified against %s:\n", rep.Against)
		for _, e := range rep.Errors {
			fmt.Fprintf(w, "  - %s\n", e)
		}
	}
	if authority != "" {
		if rep.Replica != "" {
			fmt.Fprintf(w, "Answered by replica %s of %s\n", rep.Replica, authority)
		} else {
			fmt.Fprintf(w, "No replica Lease of %s announces this leaf\n", authority)
		}
	}
	return nil
}
