package authority

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/certreport"
	"github.com/evercert/evercert/internal/errlog"
	"github.com/evercert/evercert/internal/pki"
)

// brokenSecretError is a CA Secret with parts that do not parse, as a hand
// edit leaves it: a tls.key that is not tls.crt's key, garbage in ca.crt,
// tls.crt removed. st holds the parts that did parse; the others are nil
// in it and their errors are set here.
type brokenSecretError struct {
	st                    *caSet
	signing, next, bundle error
	// foreign names a key of another rotator's layout the Secret holds:
	// another tool writes it, and writing it back would fight that tool.
	foreign string
}

func (e *brokenSecretError) parts() []error {
	var out []error
	for _, err := range []error{e.signing, e.next, e.bundle} {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

func (e *brokenSecretError) Error() string {
	var msgs []string
	for _, err := range e.parts() {
		msgs = append(msgs, err.Error())
	}
	return strings.Join(msgs, "; ")
}

func (e *brokenSecretError) Unwrap() []error { return e.parts() }

// unrepairableError is a CA Secret that cannot be used as it is and that
// this replica cannot repair: it does not hold what is missing. It is
// reported for as long as it lasts (secretRepair.reason, RotationStatus.Broken,
// reporter.failedCheck).
type unrepairableError struct {
	err error  // what is wrong with the Secret, naming the keys
	why string // why this replica cannot repair it
}

func (e *unrepairableError) Error() string {
	return fmt.Sprintf("%v; this replica cannot repair it: %s", e.err, e.why)
}

func (e *unrepairableError) Unwrap() error { return e.err }

// secretRepair repairs an Authority's CA Secret after a hand edit, from the
// last state this replica had in force (secretStore.last), as restore
// writes back a deleted Secret, and reports what it did or could not do.
// Two edits are repaired:
//
//   - a part that does not parse (the signing CA and its key, the
//     successor, ca.crt) is written back as this replica last held it;
//     the parts that parse are kept, so a successor in the Secret is never
//     lost;
//   - a signing CA that no bundle publishes (pasted into tls.crt/tls.key,
//     ca.crt untouched) is made the successor instead, through the same
//     machinery as any successor: it joins ca.crt (and so every caBundle),
//     waits for the minimum propagation delay, every Observer and every
//     live replica, then signs; meanwhile the CA this replica signed with
//     keeps signing. It replaces a successor pending on schedule (which
//     stays in ca.crt until it expires: it was published), but not the
//     successor of an emergency rotation (CompromisedCAAnnotation), and a
//     mark on the CA that signs treats it as any successor pending at the
//     mark: it never signs (see emergency.decide).
//
// A replica that does not hold what is missing (it started after the edit,
// or never saw the part that broke) writes nothing and reports the Secret
// as broken until someone repairs it: see reason.
type secretRepair struct {
	name, key string
	// report sends the Events about the CA Secret; nil until the issuer is
	// made.
	report *reporter
	// logged logs each repair once (errlog), keyed by the content that was
	// repaired.
	logged errlog.Once

	mu     sync.Mutex
	broken string // why the Secret cannot be used and is not repaired; "" when it can
}

// reason says why the CA Secret cannot be used as read and this replica
// cannot repair it; "" when it can be used (or was repaired).
func (r *secretRepair) reason() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.broken
}

func (r *secretRepair) setReason(why string) {
	r.mu.Lock()
	r.broken = why
	r.mu.Unlock()
}

// fill repairs the parts of the Secret in broken (found in err, the
// parse's error) from last, the state this replica last had in force: it
// returns the state to write back and what it repaired, or an
// *unrepairableError wrapping err.
//
// compromised is the fingerprint the Secret marks compromised, if any: a
// marked CA is never written back, as signing CA or in the bundle, even
// when this replica missed the emergency (it was partitioned through it)
// and still holds the CA as its last state.
func (r *secretRepair) fill(secret *corev1.Secret, err error, broken *brokenSecretError, last *caSet, compromised string) (*caSet, []string, error) {
	cannot := func(why string) (*caSet, []string, error) {
		err := &unrepairableError{err: err, why: why}
		r.setReason(err.Error())
		return nil, nil, err
	}
	switch {
	case broken.foreign != "":
		return cannot(fmt.Sprintf("it holds %s, another rotator's key: that rotator may still be writing it", broken.foreign))
	case last == nil:
		return cannot("it holds no earlier content of the Secret (it started after the Secret broke); restore the Secret from a backup, or fix the keys named")
	}
	st := broken.st
	var fixed []string
	if broken.signing != nil {
		if last.signing == nil || last.signing.Key == nil {
			return cannot("it holds no signing CA with its key")
		}
		pick := last.signing
		if certs, err := pki.ParseCABundle(secret.Data[corev1.TLSCertKey]); err == nil && len(certs) == 1 && last.next != nil && certs[0].Equal(last.next.Cert) {
			// tls.crt is our successor, promoted by another replica: its
			// key is the one that broke, not the promotion.
			pick = last.next
		}
		if compromised != "" && Fingerprint(pick.Cert) == compromised {
			return cannot("the signing CA it holds is marked compromised (" + CompromisedCAAnnotation + ")")
		}
		if st.next != nil && st.next.Cert.Equal(pick.Cert) {
			st.next = nil
		}
		st.signing, fixed = pick, append(fixed, corev1.TLSCertKey+"/"+corev1.TLSPrivateKeyKey)
	}
	if broken.next != nil {
		if last.next == nil || st.signing != nil && st.signing.Cert.Equal(last.next.Cert) {
			return cannot("it never held the successor CA in " + NextCertKey)
		}
		if compromised != "" && Fingerprint(last.next.Cert) == compromised {
			return cannot("the successor CA it holds is marked compromised (" + CompromisedCAAnnotation + ")")
		}
		st.next, st.nextSince, fixed = last.next, last.nextSince, append(fixed, NextCertKey)
	}
	if broken.bundle != nil {
		st.bundle = slices.DeleteFunc(slices.Clone(last.bundle), func(c *x509.Certificate) bool {
			return compromised != "" && Fingerprint(c) == compromised
		})
		fixed = append(fixed, dynamiccert.SecretCAKey)
	}
	return st, fixed, nil
}

// unpublished makes a signing CA that neither ca.crt as read nor the bundle
// this replica last published holds the successor (see secretRepair),
// signing with last's CA meanwhile. It returns what it changed in st ("":
// nothing), or an *unrepairableError when this replica holds no CA to sign
// with meanwhile. A Secret without a bundle on a replica with no state is
// the first CA (a Secret pre-created with a CA): nobody trusts anything
// yet, so it signs as it is.
func (r *secretRepair) unpublished(st *caSet, last *caSet, now time.Time) (string, error) {
	if st.signing == nil || st.signing.Key == nil || containsCert(st.bundle, st.signing.Cert) ||
		last == nil && len(st.bundle) == 0 || last != nil && containsCert(last.bundle, st.signing.Cert) {
		return "", nil
	}
	pasted := st.signing
	if last == nil || last.signing == nil || last.signing.Key == nil {
		err := &unrepairableError{
			err: fmt.Errorf("%s holds CA %q, which %s does not publish", corev1.TLSCertKey, pasted.Cert.Subject.CommonName, dynamiccert.SecretCAKey),
			why: "it holds no published CA to sign with until that CA is published (it started after the edit); add the CA to " + dynamiccert.SecretCAKey + " or restore the Secret",
		}
		r.setReason(err.Error())
		return "", err
	}
	st.signing, st.legacy = last.signing, last.legacy
	if st.next != nil && st.ops.successor != "" && Fingerprint(st.next.Cert) == st.ops.successor && st.ops.compromised != st.ops.cHandled {
		// An emergency rotation's successor is not replaced: a CA an
		// attacker may hold must stop signing as soon as it is observed.
		return fmt.Sprintf("%s held CA %q, which %s does not publish, during an emergency rotation: written back to the CA that signs; the pasted CA is not used (the emergency's successor %q is)",
			corev1.TLSCertKey, pasted.Cert.Subject.CommonName, dynamiccert.SecretCAKey, st.next.Cert.Subject.CommonName), nil
	}
	msg := fmt.Sprintf("%s held CA %q, which %s does not publish: it is published as the successor and signs once every observer has it and its minimum propagation delay has passed; CA %q signs until then",
		corev1.TLSCertKey, pasted.Cert.Subject.CommonName, dynamiccert.SecretCAKey, st.signing.Cert.Subject.CommonName)
	if st.next != nil {
		msg += fmt.Sprintf("; it replaces the successor %q, which stays in %s until it expires", st.next.Cert.Subject.CommonName, dynamiccert.SecretCAKey)
	}
	st.next, st.nextSince, st.seenSince = pasted, now, now
	return msg, nil
}

// repaired reports a repair this replica wrote: logged and sent as a
// Warning Event about the CA Secret once per broken content (errlog.Once),
// so an episode is reported once, and a new edit (after the Secret was read
// healthy again, or with other content) again.
func (r *secretRepair) repaired(secret *corev1.Secret, what string) {
	h := sha256.New()
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, KeyRefKey, dynamiccert.SecretCAKey, NextCertKey, NextKeyKey, NextKeyRefKey} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(secret.Data[k])))
		h.Write(secret.Data[k])
	}
	// Logged at info level: the Secret is usable again, nothing failed.
	if !r.logged.Info(klog.Background(), fmt.Sprintf("repaired: %x", h.Sum(nil)),
		"CA secret was edited into content that cannot be used as it is; writing back what this replica holds",
		"provider", r.name, "secret", r.key, "detail", what) {
		return
	}
	if r.report != nil {
		r.report.Event(corev1.EventTypeWarning, dynamiccert.ReasonCASecretRepaired, certreport.ActionLoad, fmt.Sprintf("CA secret %s: %s", r.key, what))
	}
}

// healthy records that the Secret as read could be used as it is.
func (r *secretRepair) healthy() {
	r.setReason("")
	r.logged.Reset()
}
