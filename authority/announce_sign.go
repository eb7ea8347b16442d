package authority

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/certmetrics"
)

// SignatureAnnotation is the signature (standard base64) of a
// replica's Lease announcement, made with the private key of the leaf the
// replica serves and announces in LeafAnnotation. It covers the
// namespace, the Lease's name, the Authority label, holderIdentity,
// leaseDurationSeconds, renewTime and every announcement annotation (see
// announcementMessage). Other replicas believe an announcement only when
// the signature verifies and the leaf chains to a CA in the CA Secret, so
// that being allowed to write Leases is not enough to confirm a successor
// CA or to claim a clock is off: that takes a leaf the Authority issued.
//
// ECDSA keys sign the SHA-256 (P-256), SHA-384 (P-384) or SHA-512 (P-521)
// of the message (ASN.1 signature), RSA keys its SHA-256 with RSASSA-PSS
// (salt as long as the hash), Ed25519 keys the message itself.
const SignatureAnnotation = "evercert.io/signature"

// announcementVersion tags the signed encoding, so that a later encoding
// can never be read as this one.
const announcementVersion = "evercert.io/replica-announcement/v1"

// announcementMessage is the canonical encoding of what l announces, which
// its signature covers: each field as its length (uvarint) and its bytes,
// so no two Leases encode the same. renewTime is encoded at the
// microsecond precision the API server stores (MicroTime).
func announcementMessage(l *coordinationv1.Lease) []byte { return appendAnnouncementMessage(nil, l) }

// announcementBufs hold the buffers checkSignedAnnouncement builds the
// message of a peer's renewal in: every replica verifies every renewal of
// every peer, and the message (the leaf's PEM, most of it) is needed only
// for the verification.
var announcementBufs = sync.Pool{New: func() any { return new([]byte) }}

// appendAnnouncementMessage appends announcementMessage(l) to b.
func appendAnnouncementMessage(b []byte, l *coordinationv1.Lease) []byte {
	var holder string
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	// The numbers and the time are formatted into buffers on the stack,
	// and the fields appended straight into one slice sized once: every
	// peer builds this for every renewal it verifies.
	var durationBuf [20]byte
	var duration []byte
	if l.Spec.LeaseDurationSeconds != nil {
		duration = strconv.AppendInt(durationBuf[:0], int64(*l.Spec.LeaseDurationSeconds), 10)
	}
	var renewBuf [64]byte
	var renew []byte
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.UTC().AppendFormat(renewBuf[:0], metav1.RFC3339Micro)
	}
	label := l.Labels[LeaseLabel]
	trusted, hash, leafSerial := l.Annotations[TrustedCAsAnnotation], l.Annotations[BundleHashAnnotation], l.Annotations[LeafSerialAnnotation]
	leaf, ahead, covered := l.Annotations[LeafAnnotation], l.Annotations[ClocksAheadAnnotation], l.Annotations[CoveredTargetsAnnotation]
	n := 13*binary.MaxVarintLen64 + len(announcementVersion) + len(l.Namespace) + len(l.Name) + len(label) + len(holder) +
		len(duration) + len(renew) + len(trusted) + len(hash) + len(leafSerial) + len(leaf) + len(ahead) + len(covered)
	b = slices.Grow(b, n)
	field := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	field(announcementVersion)
	field(l.Namespace)
	field(l.Name)
	field(label)
	field(holder)
	b = binary.AppendUvarint(b, uint64(len(duration)))
	b = append(b, duration...)
	b = binary.AppendUvarint(b, uint64(len(renew)))
	b = append(b, renew...)
	field(trusted)
	field(hash)
	field(leafSerial)
	field(leaf)
	field(ahead)
	if covered != "" {
		// Only when set, so the announcements of replicas that publish to
		// no target encode as before and a rollout from an older version
		// believes them.
		field(covered)
	}
	return b
}

// signAnnouncement sets l's SignatureAnnotation, signed with key
// over announcementMessage(l). l must be complete.
func signAnnouncement(l *coordinationv1.Lease, key crypto.Signer) error {
	msg := announcementMessage(l)
	var sig []byte
	var err error
	switch pub := key.Public().(type) {
	case ed25519.PublicKey:
		sig, err = key.Sign(rand.Reader, msg, crypto.Hash(0))
	case *ecdsa.PublicKey:
		h := ecdsaHash(pub.Curve)
		sig, err = key.Sign(rand.Reader, digest(h, msg), h)
	case *rsa.PublicKey:
		sig, err = key.Sign(rand.Reader, digest(crypto.SHA256, msg), &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256})
	default:
		return fmt.Errorf("signing the replica announcement: unsupported leaf key type %T", pub)
	}
	if err != nil {
		return fmt.Errorf("signing the replica announcement: %w", err)
	}
	l.Annotations[SignatureAnnotation] = base64.StdEncoding.EncodeToString(sig)
	return nil
}

// verifyAnnouncementSignature checks sig over msg with pub, as
// signAnnouncement made it.
func verifyAnnouncementSignature(pub crypto.PublicKey, msg, sig []byte) error {
	ok := false
	switch pub := pub.(type) {
	case ed25519.PublicKey:
		ok = ed25519.Verify(pub, msg, sig)
	case *ecdsa.PublicKey:
		ok = ecdsa.VerifyASN1(pub, digest(ecdsaHash(pub.Curve), msg), sig)
	case *rsa.PublicKey:
		ok = rsa.VerifyPSS(pub, crypto.SHA256, digest(crypto.SHA256, msg), sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256}) == nil
	default:
		return fmt.Errorf("the announced leaf's key type %T signs no announcement", pub)
	}
	if !ok {
		return errors.New("the signature does not verify over what the Lease says with the announced leaf's key")
	}
	return nil
}

func ecdsaHash(c elliptic.Curve) crypto.Hash {
	switch c.Params().BitSize {
	case 384:
		return crypto.SHA384
	case 521:
		return crypto.SHA512
	}
	return crypto.SHA256
}

func digest(h crypto.Hash, msg []byte) []byte {
	switch h {
	case crypto.SHA384:
		d := sha512.Sum384(msg)
		return d[:]
	case crypto.SHA512:
		d := sha512.Sum512(msg)
		return d[:]
	}
	d := sha256.Sum256(msg)
	return d[:]
}

// announcementMark is the last announcement believed for one Lease: an
// announcement older than it (an earlier renewTime, or a leaf the Lease
// announced before its current one) is a replay of content the Lease held
// before.
//
// A leaf's NotBefore is no measure of its age: a leaf is never backdated
// before its CA's NotBefore, so the leaf of a CA made without backdating (an
// adopted cert-manager or knative CA) can start later than its successor's
// first leaf, issued after it. Comparing NotBefore rejected genuine
// announcements as replayed after every migration (issue 27 §8); the
// leaves a Lease retired are remembered instead.
type announcementMark struct {
	renew      time.Time
	sig        []byte
	leafRaw    []byte
	chainedGen uint64 // rootsGen the leaf was found to chain in
	// retired holds the digests of the leaves this Lease announced before
	// leafRaw, newest last, at most maxRetiredLeaves.
	retired [][sha256.Size]byte
}

// maxRetiredLeaves bounds announcementMark.retired: a replica announces a
// new leaf at each renewal, so the bound covers many renewals while keeping
// a peer's memory per Lease small.
const maxRetiredLeaves = 16

// next is the mark after believing an announcement of leaf at renew with
// sig, chained in rootsGen.
func (m announcementMark) next(leaf *x509.Certificate, renew time.Time, sig []byte, rootsGen uint64) announcementMark {
	retired := m.retired
	if m.leafRaw != nil && !bytes.Equal(m.leafRaw, leaf.Raw) {
		retired = append(slices.Clone(retired), sha256.Sum256(m.leafRaw))
		if len(retired) > maxRetiredLeaves {
			retired = retired[len(retired)-maxRetiredLeaves:]
		}
	}
	return announcementMark{renew: renew, sig: sig, leafRaw: leaf.Raw, chainedGen: rootsGen, retired: retired}
}

// retiredLeaf reports whether leaf is one this Lease announced before its
// current one.
func (m announcementMark) retiredLeaf(leaf *x509.Certificate) bool {
	return slices.Contains(m.retired, sha256.Sum256(leaf.Raw))
}

// heldLease is a Lease whose latest version could not be judged yet, or
// was refused only because its leaf's CA is not in the Secret as this
// replica last read it: it is judged again when the Secret's CAs change (a
// peer may announce a leaf from a CA this replica has not read yet, or
// announce before this replica read the Secret at all).
type heldLease struct {
	lease  *coordinationv1.Lease
	seenAt time.Time
	// unlisted: see rejection.unlisted.
	unlisted string
}

// rejection is why an announcement is not believed; reason is a
// certmetrics Announcement* value, or "" for an announcement that is just
// not news (the same signed content written again) or that waits for the
// Secret.
type rejection struct {
	reason string
	err    error
	// hold: judge it again when the Secret's CAs change.
	hold bool
	// unlisted: the announced leaf chains to the Secret's CAs but is for
	// names (leafNames) the Secret does not list; see namesInUse.
	unlisted string
}

// setRoots records the CAs of the Secret as this replica just read it
// (every CA in ca.crt, the signing CA and the successor), which announced
// leaves must chain to, and judges again the Leases held for them. A read
// with no CA (the Secret is missing or was emptied: this replica writes
// back what it knows) keeps the CAs read before. It runs before every
// decision on the CA state (the store's judge), so pending sees the peers
// as the Secret being decided on allows.
func (r *replicaSet) setRoots(st *caSet) {
	if st.signing == nil {
		return
	}
	var roots []*x509.Certificate
	add := func(c *x509.Certificate) {
		for _, have := range roots {
			if have.Equal(c) {
				return
			}
		}
		roots = append(roots, c)
	}
	add(st.signing.Cert)
	if st.next != nil {
		add(st.next.Cert)
	}
	for _, c := range st.bundle {
		add(c)
	}
	for _, c := range st.recorded {
		// As trustRecorded takes them: never one the operator marked.
		if !st.ops.marks(Fingerprint(c)) {
			add(c)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rootsKnown && len(roots) == len(r.roots) && slices.Equal(st.replicaNames, r.otherNames) {
		same := true
		for n := range roots {
			same = same && roots[n].Equal(r.roots[n])
		}
		if same {
			return
		}
	}
	r.roots, r.rootsKnown = roots, true
	r.otherNames = slices.Clone(st.replicaNames)
	r.rootsGen++
	for name, h := range r.held {
		delete(r.held, name)
		r.judgedVersion[name] = ""
		r.observeLocked(h.lease, h.seenAt)
	}
}

// verdict is what judgeLocked decided about one version of a Lease: the
// announced leaf, its renewTime and signature when it is believed, else why
// not.
type verdict struct {
	leaf     *x509.Certificate
	renew    time.Time
	sig      []byte
	rejected *rejection
}

// judgeLocked decides whether l's announcement is believed: it is signed
// (SignatureAnnotation) with the key of the leaf it announces,
// that leaf chains to a CA in the Secret as this replica last read it, and
// it is no older than the last announcement believed for the Lease (its
// renewTime, and a leaf the Lease has not retired; see announcementMark).
// r.mu must be held.
func (r *replicaSet) judgeLocked(l *coordinationv1.Lease) verdict {
	leaf, sig, rej := checkSignedAnnouncement(l)
	if rej != nil {
		return verdict{rejected: rej}
	}
	renew := l.Spec.RenewTime.Truncate(time.Microsecond)
	mark, marked := r.marks[l.Name]
	if marked {
		switch {
		case renew.Before(mark.renew):
			return verdict{rejected: &rejection{reason: certmetrics.AnnouncementReplayed,
				err: fmt.Errorf("renewTime %s is older than that of the last announcement believed for this Lease (%s)",
					renew.UTC().Format(metav1.RFC3339Micro), mark.renew.UTC().Format(metav1.RFC3339Micro))}}
		case mark.retiredLeaf(leaf):
			return verdict{rejected: &rejection{reason: certmetrics.AnnouncementReplayed,
				err: fmt.Errorf("the leaf (serial %s) is one this Lease announced before the leaf of its last believed announcement", serial(leaf))}}
		case renew.Equal(mark.renew) && bytes.Equal(sig, mark.sig):
			// The same signed announcement written again (someone edited
			// another field of the Lease): no renewal, nothing new.
			return verdict{rejected: &rejection{}}
		case renew.Equal(mark.renew):
			return verdict{rejected: &rejection{reason: certmetrics.AnnouncementReplayed,
				err: fmt.Errorf("another announcement with the renewTime %s of the last one believed for this Lease", renew.UTC().Format(metav1.RFC3339Micro))}}
		}
		if bytes.Equal(leaf.Raw, mark.leafRaw) && mark.chainedGen == r.rootsGen {
			return verdict{leaf: leaf, renew: renew, sig: sig} // chains: checked for this leaf and these CAs
		}
	}
	if !r.rootsKnown {
		return verdict{rejected: &rejection{hold: true}}
	}
	if rej := checkAnnouncedLeaf(leaf, r.names, r.otherNames, r.roots); rej != nil {
		return verdict{rejected: rej}
	}
	return verdict{leaf: leaf, renew: renew, sig: sig}
}

// checkSignedAnnouncement checks what l alone can tell: it carries a
// signature that verifies over what it says with the key of the leaf it
// announces, a renewTime, and that leaf's serial. It returns the leaf and
// the signature.
func checkSignedAnnouncement(l *coordinationv1.Lease) (*x509.Certificate, []byte, *rejection) {
	encoded, signed := l.Annotations[SignatureAnnotation]
	if !signed {
		return nil, nil, &rejection{reason: certmetrics.AnnouncementUnsigned,
			err: errors.New("the Lease carries no signature (an evercert release from before signed announcements, or a replica without a leaf yet): it is not waited for, and confirms nothing, until it is upgraded")}
	}
	sig, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil || len(sig) == 0 {
		return nil, nil, &rejection{reason: certmetrics.AnnouncementGarbled, err: fmt.Errorf("annotation %s is not base64", SignatureAnnotation)}
	}
	leaf := costly.parseLeaf(l.Annotations[LeafAnnotation])
	if leaf == nil {
		return nil, nil, &rejection{reason: certmetrics.AnnouncementGarbled, err: fmt.Errorf("annotation %s holds no certificate", LeafAnnotation)}
	}
	if l.Spec.RenewTime == nil {
		return nil, nil, &rejection{reason: certmetrics.AnnouncementGarbled, err: errors.New("the Lease has no renewTime")}
	}
	buf := announcementBufs.Get().(*[]byte)
	msg := appendAnnouncementMessage((*buf)[:0], l)
	err = costly.verify(leaf.PublicKey, msg, sig)
	*buf = msg
	announcementBufs.Put(buf)
	if err != nil {
		return nil, nil, &rejection{reason: certmetrics.AnnouncementForged, err: err}
	}
	if l.Annotations[LeafSerialAnnotation] != serial(leaf) {
		return nil, nil, &rejection{reason: certmetrics.AnnouncementGarbled, err: fmt.Errorf("annotation %s is not the announced leaf's serial", LeafSerialAnnotation)}
	}
	return leaf, sig, nil
}

// checkAnnouncedLeaf checks that leaf is one the Authority issued to a
// replica: for its names (leafNames; "" checks none) and signed by one of
// roots, the CAs of the Secret.
func checkAnnouncedLeaf(leaf *x509.Certificate, names string, others []string, roots []*x509.Certificate) *rejection {
	// A leaf for this Authority's own names, or for names the Secret lists
	// as its replicas' (ReplicaNamesAnnotation: another Authority on the
	// same Secret, a rollout that changes Hosts): the Authority's CA also
	// signs leaves for others (podcert's PodCertificateRequests, SignLeaf),
	// and their holders must not confirm anything for its replicas. Held,
	// so that a list that grows judges it again.
	got := leafNames(leaf.DNSNames, leaf.IPAddresses)
	unlisted := names != "" && got != names && !slices.Contains(others, got)
	// Chains to a CA in the Secret, by signature only: validity periods are
	// not checked here (clock skew is judged elsewhere, from believed
	// announcements only), and a leaf needs no intermediates.
	if !slices.ContainsFunc(roots, func(ca *x509.Certificate) bool { return costly.signedBy(leaf, ca) }) {
		return &rejection{reason: certmetrics.AnnouncementForged, hold: true,
			err: fmt.Errorf("the announced leaf (serial %s, issuer %q) does not chain to a CA in the CA Secret", serial(leaf), leaf.Issuer.CommonName)}
	}
	if unlisted {
		return &rejection{reason: certmetrics.AnnouncementForged, hold: true, unlisted: got,
			err: fmt.Errorf("the announced leaf (serial %s) is for %s, neither this Authority's names %s nor names the CA Secret lists (%s)", serial(leaf), got, names, ReplicaNamesAnnotation)}
	}
	return nil
}

// AnnouncementError is why VerifyAnnouncement does not believe a replica
// announcement.
type AnnouncementError struct {
	// Reason is "unsigned", "garbled" or "forged": the reason label the
	// Authority counts the same rejection under in
	// evercert_replica_announcements_rejected_total.
	Reason string
	// Err says what is wrong.
	Err error
}

func (e *AnnouncementError) Error() string { return e.Reason + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *AnnouncementError) Unwrap() error { return e.Err }

// VerifyAnnouncement checks the announcement in a replica's Lease as the
// Authority's replicas check each other's before they believe one, and
// returns the announced leaf: the Lease is signed
// (SignatureAnnotation) with the key of the leaf it announces,
// over everything it announces; the leaf serial annotation is that
// leaf's; the leaf is signed by one of cas, the CAs the CA Secret holds
// (tls.crt, next.crt and ca.crt); and, when hosts is not empty (the
// Authority's Config.Hosts), the leaf is for exactly those names or for
// names in listed (ReplicaNames of the CA Secret: the other replicas'),
// since the Authority's CA also signs leaves for others (podcert,
// SignLeaf) whose holders could otherwise announce. An announcement that
// fails is an *AnnouncementError.
//
// What one read cannot check is replay: a replica also refuses an
// announcement older than the last one it believed for the same Lease,
// which takes the history a running replica keeps.
func VerifyAnnouncement(l *coordinationv1.Lease, cas []*x509.Certificate, hosts, listed []string) (*x509.Certificate, error) {
	leaf, _, rej := checkSignedAnnouncement(l)
	if rej == nil {
		names := ""
		if len(hosts) > 0 {
			var dnsNames []string
			var ips []net.IP
			for _, h := range hosts {
				if ip := net.ParseIP(h); ip != nil {
					ips = append(ips, ip)
				} else {
					dnsNames = append(dnsNames, h)
				}
			}
			names = leafNames(dnsNames, ips)
		}
		rej = checkAnnouncedLeaf(leaf, names, listed, cas)
	}
	if rej != nil {
		return nil, &AnnouncementError{Reason: rej.reason, Err: rej.err}
	}
	return leaf, nil
}

// rejectLocked counts and logs (once per Lease and reason) an announcement
// that is not believed. r.mu must be held.
func (r *replicaSet) rejectLocked(l *coordinationv1.Lease, rej *rejection) {
	if rej.reason == "" {
		return
	}
	certmetrics.ReplicaAnnouncementRejected(r.provider, rej.reason)
	logger := klog.Background()
	kv := []any{"provider", r.provider, "lease", klog.KRef(l.Namespace, l.Name), "reason", rej.reason}
	once := r.rejectLog.Get(l.Name + "\x00" + rej.reason)
	if rej.reason == certmetrics.AnnouncementUnsigned {
		once.Info(logger, "unsigned", "Warning: ignoring an unsigned replica announcement; that replica is not waited for until it runs a release that signs", kv...)
		return
	}
	once.Error(logger, fmt.Errorf("replica announcement in Lease %s/%s: %w", l.Namespace, l.Name, rej.err), "Ignoring a replica announcement", kv...)
}

// forgetAnnouncementLocked drops what is kept about the Lease name once it
// is forgotten. r.mu must be held.
func (r *replicaSet) forgetAnnouncementLocked(name string) {
	delete(r.marks, name)
	delete(r.held, name)
	delete(r.judgedVersion, name)
	for _, reason := range []string{certmetrics.AnnouncementForged, certmetrics.AnnouncementReplayed, certmetrics.AnnouncementGarbled, certmetrics.AnnouncementUnsigned} {
		r.rejectLog.Forget(name + "\x00" + reason)
	}
}

// leafNames is the canonical form of a serving leaf's subject alternative
// names, which every replica of one Authority issues its leaves for: sorted,
// lower-cased DNS names, then sorted IP addresses.
func leafNames(dnsNames []string, ips []net.IP) string {
	names := make([]string, 0, len(dnsNames))
	for _, n := range dnsNames {
		names = append(names, strings.ToLower(n))
	}
	slices.Sort(names)
	addrs := make([]string, 0, len(ips))
	for _, ip := range ips {
		addrs = append(addrs, ip.String())
	}
	slices.Sort(addrs)
	return "[" + strings.Join(names, " ") + "] [" + strings.Join(addrs, " ") + "]"
}
