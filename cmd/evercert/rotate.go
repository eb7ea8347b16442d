package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/backoff"
)

// rotateReport is what `rotate` prints (-o json: this structure).
type rotateReport struct {
	Secret string `json:"secret"`
	// Annotations are the ones this command set.
	Annotations map[string]string `json:"annotations"`
	// Waited is whether --wait was given; Handled whether the Authority
	// recorded that it acted (only known with --wait).
	Waited  bool `json:"waited"`
	Handled bool `json:"handled"`
	// ReplacedMark is the fingerprint of an earlier compromised-ca mark
	// this command replaced: one that matched no CA in the Secret, which
	// the Authority ignores (a CARequestIgnored Event), so nothing was
	// pending on it.
	ReplacedMark string `json:"replacedMark,omitempty"`
}

// Backoff of the --wait poll: it reads one Secret, so a few seconds apart
// at most is both prompt and cheap.
const (
	waitPollInitial = 250 * time.Millisecond
	waitPollCap     = 5 * time.Second
)

// Backoff of what --wait says on stderr while it waits: the first line
// after waitSayInitial (a request acted on at once prints nothing), then
// twice as far apart each time up to waitSayCap, so a long wait neither
// floods the terminal nor goes silent. Each line also lists the replicas'
// Leases: one request more, at most this often.
const (
	waitSayInitial = 2 * time.Second
	waitSayCap     = 30 * time.Second
)

// defaultRotateTimeout is rotate's --timeout when none is given: how long
// the command may take, --wait included.
const defaultRotateTimeout = 2 * time.Minute

func runRotate(prog string, args []string, stdout, stderr io.Writer) error {
	var common commonFlags
	var compromised, wait bool
	var reason, fingerprint string
	timeout := defaultRotateTimeout
	fs := newFlagSet(prog, "rotate", "<ca-secret> [--compromised --reason TEXT [--ca FINGERPRINT]] [--wait [--timeout 2m]]", &common)
	fs.BoolVar(&compromised, "compromised", false, "the CA is compromised: rotate at once and stop trusting it as soon as no live replica serves a leaf from it (requires --reason)")
	fs.StringVar(&reason, "reason", "", "why the CA is compromised, recorded on the Secret (required with --compromised)")
	fs.StringVar(&fingerprint, "ca", "", "the fingerprint of the compromised CA (default the signing CA in tls.crt)")
	fs.BoolVar(&wait, "wait", false, "wait until the Authority records that it acted on the request")
	fs.DurationVar(&timeout, "timeout", timeout, "how long the command may take, --wait included")
	pos, err := parse(fs, &common, args, 1)
	if err != nil {
		return err
	}
	if compromised && strings.TrimSpace(reason) == "" {
		return usagef("--compromised requires a non-empty --reason")
	}
	if !compromised && (fs.Changed("reason") || fs.Changed("ca")) {
		return usagef("--reason and --ca go with --compromised")
	}
	if timeout <= 0 {
		return usagef("--timeout %v must be positive", timeout)
	}
	k, err := common.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	name := pos[0]
	rep := &rotateReport{Secret: k.namespace + "/" + name, Waited: wait}
	now := time.Now().UTC().Format(time.RFC3339)

	var requestKey, handledKey, want string
	secrets := k.client.CoreV1().Secrets(k.namespace)
	// A conflict means another writer (a replica) changed the Secret
	// between the read and the write: read again and re-apply.
	err = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading the CA Secret %s: %w", rep.Secret, err)
		}
		set := map[string]string{}
		rep.ReplacedMark = ""
		if compromised {
			fp, err := compromisedCA(s, fingerprint)
			if err != nil {
				return err
			}
			if prev := s.Annotations[authority.CompromisedCAAnnotation]; prev != "" && prev != fp &&
				s.Annotations[authority.CompromisedHandledAnnotation] != prev {
				// A mark naming no CA the Secret holds (a mistyped
				// fingerprint) is ignored by the Authority: it is not a
				// request pending, and refusing here would leave the
				// operator to hand-edit the annotation mid-incident.
				if !slices.ContainsFunc(secretCAs(s), func(c *x509.Certificate) bool { return authority.Fingerprint(c) == prev }) {
					rep.ReplacedMark = prev
				} else {
					return usagef("the Secret %s already marks CA %s compromised and the Authority has not finished with it (%s is not %s yet); wait for that first",
						rep.Secret, prev, authority.CompromisedHandledAnnotation, prev)
				}
			}
			set[authority.CompromisedCAAnnotation] = fp
			set[authority.CompromisedReasonAnnotation] = reason
			set[authority.CompromisedAtAnnotation] = now
			requestKey, handledKey, want = authority.CompromisedCAAnnotation, authority.CompromisedHandledAnnotation, fp
		} else {
			set[authority.RotateRequestedAnnotation] = now
			requestKey, handledKey, want = authority.RotateRequestedAnnotation, authority.RotateHandledAnnotation, now
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		for k, v := range set {
			s.Annotations[k] = v
		}
		if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			return err
		}
		rep.Annotations = set
		return nil
	})
	if err != nil {
		var ce *codedError
		if !errors.As(err, &ce) && !strings.Contains(err.Error(), rep.Secret) {
			err = fmt.Errorf("updating the CA Secret %s: %w", rep.Secret, err)
		}
		return err
	}
	if wait {
		w := waitTarget{name: name, key: handledKey, want: want, compromised: compromised}
		if err := k.waitHandled(ctx, w, timeout, stderr, prog); err != nil {
			return err
		}
		rep.Handled = true
	}
	if common.output == "json" {
		return printJSON(stdout, rep)
	}
	what := "observed rotation requested"
	if rep.ReplacedMark != "" {
		fmt.Fprintf(stdout, "%s: replaced the earlier mark %s=%s: it matches no CA in the Secret, so the Authority had ignored it\n",
			rep.Secret, authority.CompromisedCAAnnotation, rep.ReplacedMark)
	}
	if compromised {
		what = fmt.Sprintf("CA %s marked compromised", want)
	}
	fmt.Fprintf(stdout, "%s: %s (%s=%s)\n", rep.Secret, what, requestKey, want)
	if wait {
		fmt.Fprintf(stdout, "%s: the Authority acted on it (%s=%s)\n", rep.Secret, handledKey, want)
	} else {
		fmt.Fprintf(stdout, "follow it with: status %s (or rotate --wait)\n", name)
	}
	return nil
}

// compromisedCA returns the fingerprint to mark compromised: the one asked
// for, which must be a CA the Secret holds, or else the signing CA's.
func compromisedCA(s *corev1.Secret, asked string) (string, error) {
	cas := secretCAs(s)
	if asked == "" {
		signing := parseCertPEM(s.Data[corev1.TLSCertKey])
		if signing == nil {
			return "", fmt.Errorf("the CA Secret %s/%s holds no signing CA in %s; name the CA with --ca", s.Namespace, s.Name, corev1.TLSCertKey)
		}
		return authority.Fingerprint(signing), nil
	}
	asked = strings.ToLower(strings.TrimSpace(asked))
	var known []string
	for _, c := range cas {
		fp := authority.Fingerprint(c)
		if fp == asked {
			return fp, nil
		}
		if !slices.Contains(known, fp) {
			known = append(known, fp)
		}
	}
	return "", usagef("--ca %s: the CA Secret %s/%s holds no CA with that fingerprint (it holds %s)", asked, s.Namespace, s.Name, strings.Join(known, ", "))
}

// waitTarget is what --wait waits for: the annotation key on the CA
// Secret name to equal want; compromised when want is a CA marked
// compromised (the emergency rotation drains it).
type waitTarget struct {
	name, key, want string
	compromised     bool
}

// waitHandled polls the Secret, backing off with jitter up to
// waitPollCap, until the annotation w.key equals w.want or ctx ends. While
// it waits it says on stderr, backing off from waitSayInitial to
// waitSayCap, what it waits for (waitingFor); the timeout error says it
// too, read once more in the part of the timeout kept for it.
func (k *kube) waitHandled(ctx context.Context, w waitTarget, timeout time.Duration, stderr io.Writer, prog string) error {
	clk := clock.RealClock{}
	// The last read is kept out of the poll, so that the timeout error
	// can name the replicas as they are at the end, within --timeout.
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = clk.Now().Add(timeout)
	}
	pollCtx, cancel := context.WithDeadline(ctx, deadline.Add(-min(2*time.Second, timeout/4)))
	defer cancel()
	var last string
	var lastErr error
	var lastSecret *corev1.Secret
	say, sayEvery := clk.Now().Add(waitSayInitial), waitSayInitial
	done := backoff.Retry(pollCtx, clk, waitPollInitial, waitPollCap, func(ctx context.Context) error {
		s, err := k.client.CoreV1().Secrets(k.namespace).Get(ctx, w.name, metav1.GetOptions{})
		if lastErr = err; err != nil {
			return err
		}
		lastSecret = s
		if last = s.Annotations[w.key]; last == w.want {
			return nil
		}
		if now := clk.Now(); !now.Before(say) {
			fmt.Fprintf(stderr, "%s: %s\n", prog, k.waitingFor(ctx, w, s, now))
			sayEvery = min(2*sayEvery, waitSayCap)
			say = now.Add(sayEvery)
		}
		return errors.New("not handled yet")
	}, nil)
	if done {
		return nil
	}
	seen := "not set"
	if last != "" {
		seen = fmt.Sprintf("%q", last)
	}
	// A read cut short by the deadline itself says nothing; any other
	// failure is why the wait could not tell.
	if lastErr != nil && !errors.Is(lastErr, context.DeadlineExceeded) && !errors.Is(lastErr, context.Canceled) {
		seen = fmt.Sprintf("unknown (the last read failed: %v)", lastErr)
	}
	why := "is an Authority running for this Secret, and can it update it?"
	if lastSecret != nil {
		why = k.waitingOn(ctx, w, lastSecret, clk.Now())
	}
	return fmt.Errorf("timed out after %v waiting for the Authority to act: %s on Secret %s/%s is %s, want %q (%s)",
		timeout, w.key, k.namespace, w.name, seen, w.want, why)
}

// waitingFor is the line --wait prints while it waits: the annotation, its
// value and what the Authority waits on (waitingOn).
func (k *kube) waitingFor(ctx context.Context, w waitTarget, s *corev1.Secret, now time.Time) string {
	seen := "not set"
	if v := s.Annotations[w.key]; v != "" {
		seen = v
	}
	return fmt.Sprintf("waiting for %s on Secret %s/%s: now %s, want %s; %s", w.key, k.namespace, w.name, seen, w.want, k.waitingOn(ctx, w, s, now))
}

// waitingOn says which live replicas the Authority waits on, from their
// Leases verified as status verifies them (authority.VerifyAnnouncement;
// a rejected Lease is no replica): those whose announcement does not trust
// the successor CA in the Secret (next.crt) yet or, once the successor of a
// compromised CA signs, those still serving a leaf the compromised CA
// signed. With no live replica it asks whether an Authority runs at all.
func (k *kube) waitingOn(ctx context.Context, w waitTarget, s *corev1.Secret, now time.Time) string {
	cas := secretCAs(s)
	replicas, err := k.replicas(ctx, w.name, now, cas, nil, nil)
	if err != nil {
		return fmt.Sprintf("the replicas are unknown: %v", err)
	}
	successor := parseCertPEM(s.Data[authority.NextCertKey])
	signing := parseCertPEM(s.Data[corev1.TLSCertKey])
	// The compromised CA no longer signs: the emergency rotation drains
	// it, waiting for every live replica to serve a leaf of its successor.
	draining := w.compromised && signing != nil && authority.Fingerprint(signing) != w.want
	var live, pending []string
	for _, r := range replicas {
		if !r.believed() {
			continue
		}
		live = append(live, r.ID)
		switch {
		case draining:
			if issuer(r.leaf, cas) == w.want {
				pending = append(pending, r.waitedOn(now))
			}
		case successor != nil && !slices.Contains(r.TrustedCAs, authority.Fingerprint(successor)):
			pending = append(pending, r.waitedOn(now))
		}
	}
	switch {
	case len(live) == 0:
		return "no live replica announces itself in a Lease: is an Authority running for this Secret, and can it update it?"
	case draining && len(pending) > 0:
		return fmt.Sprintf("CA %s signs; live replicas still serving a leaf from compromised CA %s: %s", authority.Fingerprint(signing), w.want, strings.Join(pending, ", "))
	case draining:
		return fmt.Sprintf("CA %s signs and no live replica serves a leaf from compromised CA %s any more", authority.Fingerprint(signing), w.want)
	case successor == nil:
		return fmt.Sprintf("no successor CA in the Secret yet (live replicas: %s)", strings.Join(live, ", "))
	case len(pending) > 0:
		return fmt.Sprintf("live replicas that have not announced successor CA %s: %s", authority.Fingerprint(successor), strings.Join(pending, ", "))
	default:
		return fmt.Sprintf("every live replica announced successor CA %s (%s)", authority.Fingerprint(successor), strings.Join(live, ", "))
	}
}
