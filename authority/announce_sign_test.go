package authority

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/certmetrics/certmetricstest"
	"github.com/evercert/evercert/internal/pki"
)

// signAsReplica makes l the announcement of a replica of the Authority of
// its label's Secret, as evercert writes it: a fresh leaf issued at now by
// the Secret's signing CA, announced and signing. Without the Secret (or
// its key) l stays unsigned, as a replica without a leaf writes it.
func signAsReplica(t testing.TB, client kubernetes.Interface, l *coordinationv1.Lease, now time.Time) {
	t.Helper()
	s, err := client.CoreV1().Secrets(l.Namespace).Get(context.Background(), l.Labels[LeaseLabel], metav1.GetOptions{})
	if err != nil {
		return
	}
	pair, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
	if err != nil {
		return
	}
	ca := &pki.Issued{Cert: pair.Leaf, Key: pair.PrivateKey.(crypto.Signer)}
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "replica", DNSNames: []string{"localhost"}, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[LeafAnnotation] = string(leafCertPEM(leaf.Cert))
	l.Annotations[LeafSerialAnnotation] = serial(leaf.Cert)
	require.NoError(t, signAnnouncement(l, leaf.Key))
}

// signWorld is a promotionWorld whose replicas can be stopped one by one
// and whose observers can hold a successor back.
type signWorld struct {
	*promotionWorld
	stops []func()
	gates []*gateObserver
}

// gateObserver confirms the CAs it was shown before it closed, and every
// CA once it opens: a consumer that has not loaded the successor yet.
type gateObserver struct {
	listeners
	mu    sync.Mutex
	known map[string]bool
	open  bool
}

func (o *gateObserver) Name() string { return "gate" }
func (o *gateObserver) Observed(ca *x509.Certificate) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.open || o.known[Fingerprint(ca)]
}

// close confirms only what is in bundle (PEM) from now on.
func (o *gateObserver) close(t *testing.T, bundle []byte) {
	cas, err := pki.ParseCABundle(bundle)
	require.NoError(t, err)
	o.mu.Lock()
	o.open, o.known = false, map[string]bool{}
	for _, c := range cas {
		o.known[Fingerprint(c)] = true
	}
	o.mu.Unlock()
	o.notify()
}

func (o *gateObserver) openUp() {
	o.mu.Lock()
	o.open = true
	o.mu.Unlock()
	o.notify()
}

func newSignWorld(t *testing.T, n int) *signWorld {
	hosts := make([][]string, n)
	for r := range hosts {
		hosts[r] = []string{"localhost"}
	}
	return newSignWorldHosts(t, hosts)
}

// newSignWorldHosts is newSignWorld with replica r issuing its leaves for
// hosts[r].
func newSignWorldHosts(t *testing.T, hosts [][]string) *signWorld {
	n := len(hosts)
	client := fake.NewClientset()
	optimistic(client)
	w := &signWorld{promotionWorld: &promotionWorld{t: t, client: client, clk: clocktesting.NewFakeClock(testNow)}}
	for r := range n {
		gate := &gateObserver{open: true}
		a, err := New(Config{
			Name: fmt.Sprintf("%s-r%d", t.Name(), r), Namespace: "ns", SecretName: "ca", Client: client,
			ReplicaID: fmt.Sprintf("r%d", r), Hosts: hosts[r], Lifetime: time.Hour,
			PropagationDelay: 10 * time.Second, Observers: []Observer{gate}, Clock: w.clk,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			a.Run(ctx, 1)
		}()
		stop := sync.OnceFunc(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(guard):
				t.Error("Run did not return after its context ended")
			}
		})
		t.Cleanup(stop)
		waitFor(t, "the leaf", func() bool { return a.Leaf() != nil })
		w.replicas = append(w.replicas, a)
		w.stops = append(w.stops, stop)
		w.gates = append(w.gates, gate)
	}
	w.settle()
	return w
}

// stop stops the last replica's Run loop; the others go on.
func (w *signWorld) stop() *Authority {
	last := len(w.replicas) - 1
	a := w.replicas[last]
	w.stops[last]()
	w.replicas, w.stops, w.gates = w.replicas[:last], w.stops[:last], w.gates[:last]
	w.settle()
	return a
}

// delayEnds is the latest end of the published successor's minimum delay
// that the replicas report.
func (w *signWorld) delayEnds() time.Time {
	var ends time.Time
	for _, a := range w.replicas {
		if s := a.Status().Successor; s != nil && s.SignsNoEarlierThan.After(ends) {
			ends = s.SignsNoEarlierThan
		}
	}
	return ends
}

// untilSigned steps until the CA fp signs, at most promotionBound.
func (w *signWorld) untilSigned(fp string) {
	w.t.Helper()
	until := w.clk.Now().Add(promotionBound)
	for !w.signedBy(fp) {
		require.False(w.t, w.clk.Now().After(until), "the successor did not sign once every consumer held it")
		w.step(promotionStep)
	}
}

// untilSuccessor steps a minute at a time until a successor is published
// and returns its fingerprint.
func (w *signWorld) untilSuccessor() string {
	w.t.Helper()
	began := w.clk.Now()
	for {
		for _, a := range w.replicas {
			if s := a.Status().Successor; s != nil {
				return s.Fingerprint
			}
		}
		require.False(w.t, w.clk.Now().After(began.Add(24*time.Hour)), "no successor was published")
		w.step(time.Minute)
	}
}

// lease reads the Lease of replica id.
func (w *signWorld) lease(id string) *coordinationv1.Lease {
	w.t.Helper()
	l, err := w.client.CoordinationV1().Leases("ns").Get(context.Background(), replicaLeaseName("ca", id), metav1.GetOptions{})
	require.NoError(w.t, err)
	return l
}

// overwrite writes what forge makes of replica id's current Lease, as
// anyone allowed to update Leases in the namespace can, and lets the
// replicas see it.
func (w *signWorld) overwrite(id string, forge func(*coordinationv1.Lease)) {
	w.t.Helper()
	l := w.lease(id)
	forge(l)
	_, err := w.client.CoordinationV1().Leases("ns").Update(context.Background(), l, metav1.UpdateOptions{})
	require.NoError(w.t, err)
	w.settle()
}

func rejected(t *testing.T, a *Authority, reason string) float64 {
	return certmetricstest.Value(t, "evercert_replica_announcements_rejected_total", map[string]string{"provider": a.Name(), "reason": reason})
}

// foreignLeaf is a leaf of a CA that is not in the Secret, with its key.
func foreignLeaf(t *testing.T, now time.Time) *pki.Issued {
	ca, err := pki.NewCA(pki.Request{CommonName: "attacker", Now: now, Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "localhost", DNSNames: []string{"localhost"}, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	return leaf
}

// TestAnnouncementForgedTrustDoesNotPromote: replica r1's consumers have
// not loaded the successor, so r1 does not announce it. Someone allowed to
// write Leases overwrites r1's Lease after every step, claiming r1 trusts
// the successor: once by editing the signed annotation, once by signing
// the claim with a leaf of a CA of their own. The successor must not sign
// before r1's consumers hold it (before signed announcements, r0 believed
// the Lease and promoted); once they do, it signs.
func TestAnnouncementForgedTrustDoesNotPromote(t *testing.T) {
	w := newSignWorld(t, 2)
	w.gates[1].close(t, w.replicas[1].CurrentCABundleContent())
	fp := w.untilSuccessor()
	delayEnds := w.delayEnds()
	attacker := foreignLeaf(t, w.clk.Now())
	claim := func(l *coordinationv1.Lease) {
		l.Annotations[TrustedCAsAnnotation] = strings.Join(append(strings.Split(l.Annotations[TrustedCAsAnnotation], ","), fp), ",")
		l.Spec.RenewTime = &metav1.MicroTime{Time: w.clk.Now()}
	}
	for n := 0; w.clk.Now().Before(delayEnds.Add(5 * time.Minute)); n++ {
		w.step(5 * time.Second)
		if n%2 == 0 {
			w.overwrite("r1", claim) // the signature no longer covers it
		} else {
			w.overwrite("r1", func(l *coordinationv1.Lease) {
				claim(l)
				l.Annotations[LeafAnnotation] = string(leafCertPEM(attacker.Cert))
				l.Annotations[LeafSerialAnnotation] = serial(attacker.Cert)
				require.NoError(t, signAnnouncement(l, attacker.Key))
			})
		}
		require.False(t, w.signedBy(fp), "the successor signed on a forged announcement, before replica r1's consumers held it")
		require.Contains(t, w.replicas[0].Status().Successor.Pending, "replica/r1")
	}
	require.Positive(t, rejected(t, w.replicas[0], certmetrics.AnnouncementForged), "forged announcements are counted")
	w.gates[1].openUp()
	w.untilSigned(fp)
}

// TestAnnouncementForgerCannotStallPromotion: replica r2 stops for good
// just as a successor is published. Someone keeps rewriting its Lease so
// that it looks renewed, without its key: a replay of an older version, a
// renewal with the signature left as it was, a garbled one, or an unsigned
// one (as an evercert release from before signed announcements writes).
// The successor must still sign once r2's last believed announcement has
// aged out (before, every rewrite counted as a renewal and the successor
// waited for r2 forever), and the rewrites are counted.
func TestAnnouncementForgerCannotStallPromotion(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reason string
		forge  func(w *signWorld, old *coordinationv1.Lease, dead *Authority, n int) func(*coordinationv1.Lease)
	}{
		{"replayed", certmetrics.AnnouncementReplayed, func(w *signWorld, old *coordinationv1.Lease, _ *Authority, _ int) func(*coordinationv1.Lease) {
			return func(l *coordinationv1.Lease) { l.Annotations, l.Spec = old.Annotations, old.Spec }
		}},
		{"forged", certmetrics.AnnouncementForged, func(w *signWorld, _ *coordinationv1.Lease, _ *Authority, _ int) func(*coordinationv1.Lease) {
			return func(l *coordinationv1.Lease) { l.Spec.RenewTime = &metav1.MicroTime{Time: w.clk.Now()} }
		}},
		{"garbled", certmetrics.AnnouncementGarbled, func(w *signWorld, _ *coordinationv1.Lease, dead *Authority, n int) func(*coordinationv1.Lease) {
			return func(l *coordinationv1.Lease) {
				l.Spec.RenewTime = &metav1.MicroTime{Time: w.clk.Now()}
				switch n % 3 {
				case 0:
					l.Annotations[SignatureAnnotation] = "not base64!"
				case 1:
					l.Annotations[LeafAnnotation] = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
				case 2:
					// Signed with the replica's own key, over other bytes.
					other := l.DeepCopy()
					other.Name += "-other"
					require.NoError(w.t, signAnnouncement(other, leafKeyOf(dead)))
					l.Annotations[SignatureAnnotation] = other.Annotations[SignatureAnnotation]
				}
			}
		}},
		{"unsigned", certmetrics.AnnouncementUnsigned, func(w *signWorld, _ *coordinationv1.Lease, _ *Authority, _ int) func(*coordinationv1.Lease) {
			return func(l *coordinationv1.Lease) {
				delete(l.Annotations, SignatureAnnotation)
				l.Spec.RenewTime = &metav1.MicroTime{Time: w.clk.Now()}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSignWorld(t, 3)
			old := w.lease("r2") // a version r2 will have renewed since
			w.step(time.Minute)
			fp := w.untilSuccessor()
			// r2 crashes: its process ends without releasing or deleting
			// its Lease (a graceful shutdown would), which the forger then
			// keeps rewriting.
			var crashing atomic.Bool
			r2Lease := replicaLeaseName("ca", "r2")
			for _, verb := range []string{"update", "delete"} {
				w.client.PrependReactor(verb, "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
					name := ""
					switch a := a.(type) {
					case clienttesting.UpdateAction:
						name = a.GetObject().(metav1.Object).GetName()
					case clienttesting.DeleteAction:
						name = a.GetName()
					}
					if crashing.Load() && name == r2Lease {
						return true, nil, errors.New("the process was killed")
					}
					return false, nil, nil
				})
			}
			crashing.Store(true)
			dead := w.stop()
			crashing.Store(false)
			stoppedAt := w.clk.Now()
			lease := w.replicas[0].cfg.LeaseDuration
			for n := 0; !w.signedBy(fp); n++ {
				require.False(t, w.clk.Now().After(stoppedAt.Add(lease+10*time.Minute)),
					"the successor never signed: a stopped replica whose Lease is rewritten without its key (%s) was waited for; pending %v", tc.name, w.replicas[0].Status().Successor)
				w.overwrite("r2", tc.forge(w, old, dead, n))
				w.step(5 * time.Second)
			}
			for _, a := range w.replicas {
				require.Zero(t, a.Status().UnsafeRotations, a.Name())
				require.Positive(t, rejected(t, a, tc.reason), "%s announcements are counted by %s", tc.name, a.Name())
			}
		})
	}
}

// leafKeyOf is the private key of a's leaf, for a test that signs other
// bytes with it.
func leafKeyOf(a *Authority) crypto.Signer {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.leaf.Key
}

// TestAnnouncementForgedClocksAheadDoesNotStall: someone rewrites the
// Leases of r1 and r2 to say r0's clock is ahead of theirs. Before signed
// announcements r0 believed it, found most live replicas saying its clock
// leads, and stopped writing the Secret and issuing leaves (a clock skew
// hold). Now the rewrites are ignored and counted, and r0 keeps going.
func TestAnnouncementForgedClocksAheadDoesNotStall(t *testing.T) {
	w := newSignWorld(t, 3)
	for range 20 {
		for _, id := range []string{"r1", "r2"} {
			w.overwrite(id, func(l *coordinationv1.Lease) { l.Annotations[ClocksAheadAnnotation] = "r0" })
		}
		w.step(5 * time.Second)
		require.Empty(t, w.replicas[0].Status().ClockSkew, "r0 held its writes on forged clock evidence")
	}
	require.Positive(t, rejected(t, w.replicas[0], certmetrics.AnnouncementForged))
	w.rotate() // and a rotation completes
}

// TestAnnouncementSignatureKeyTypes: every leaf key type signs an
// announcement its peers verify, and a change to any signed field breaks
// the signature.
func TestAnnouncementSignatureKeyTypes(t *testing.T) {
	for _, kt := range pki.KeyTypes {
		t.Run(string(kt), func(t *testing.T) {
			key, err := pki.GenerateKey(kt)
			require.NoError(t, err)
			l := &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca-r0", Labels: map[string]string{LeaseLabel: "ca"},
					Annotations: map[string]string{TrustedCAsAnnotation: "a,b"}},
			}
			require.NoError(t, signAnnouncement(l, key))
			sig, err := base64.StdEncoding.DecodeString(l.Annotations[SignatureAnnotation])
			require.NoError(t, err)
			require.NoError(t, verifyAnnouncementSignature(key.Public(), announcementMessage(l), sig))
			l.Annotations[TrustedCAsAnnotation] = "a,b,c"
			require.Error(t, verifyAnnouncementSignature(key.Public(), announcementMessage(l), sig))
		})
	}
	ec, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	require.NoError(t, err)
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
	require.NoError(t, signAnnouncement(l, ec))
	sig, _ := base64.StdEncoding.DecodeString(l.Annotations[SignatureAnnotation])
	require.NoError(t, verifyAnnouncementSignature(ec.Public(), announcementMessage(l), sig))
}

// TestAnnouncementFromAnotherLeafOfTheCADoesNotPromote: the Authority's CA
// also signs leaves for others (podcert's PodCertificateRequests go through
// SignLeaf). A pod holding such a leaf, with its key, and allowed to write
// Leases, signs r1's announcement claiming r1 trusts the successor. The
// leaf chains to the CA in the Secret and the signature verifies, but the
// leaf is not for this Authority's names: it must not confirm anything.
func TestAnnouncementFromAnotherLeafOfTheCADoesNotPromote(t *testing.T) {
	w := newSignWorld(t, 2)
	w.gates[1].close(t, w.replicas[1].CurrentCABundleContent())
	fp := w.untilSuccessor()
	delayEnds := w.delayEnds()
	podKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	pod, err := w.replicas[0].SignLeaf(LeafRequest{PublicKey: podKey.Public(), CommonName: "pod", DNSNames: []string{"pod.ns.svc"}, Lifetime: time.Hour})
	require.NoError(t, err, "a leaf for a pod from the Authority's signing CA")
	for w.clk.Now().Before(delayEnds.Add(5 * time.Minute)) {
		w.step(5 * time.Second)
		w.overwrite("r1", func(l *coordinationv1.Lease) {
			l.Annotations[TrustedCAsAnnotation] = strings.Join(append(strings.Split(l.Annotations[TrustedCAsAnnotation], ","), fp), ",")
			l.Spec.RenewTime = &metav1.MicroTime{Time: w.clk.Now()}
			l.Annotations[LeafAnnotation] = string(pod.CertPEM)
			l.Annotations[LeafSerialAnnotation] = serial(pod.Cert)
			require.NoError(t, signAnnouncement(l, podKey))
		})
		require.False(t, w.signedBy(fp), "the successor signed on an announcement signed with a pod's leaf, before replica r1's consumers held it")
		require.Contains(t, w.replicas[0].Status().Successor.Pending, "replica/r1")
	}
	require.Positive(t, rejected(t, w.replicas[0], certmetrics.AnnouncementForged), "announcements signed with another leaf of the CA are counted as forged")
}

// TestVerifyAnnouncement: the exported check (the CLI's) believes what the
// replicas believe and rejects, with the reason they count it under, what
// they reject: a genuine announcement verifies and returns its leaf; the
// same announcement under another Lease name, or edited, is forged; one
// whose leaf is from another CA, or (with hosts) for other names, is
// forged; no signature is unsigned; a signature that is not base64 is
// garbled.
func TestVerifyAnnouncement(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "ca", Now: now, Lifetime: 24 * time.Hour})
	require.NoError(t, err)
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "svc", DNSNames: []string{"svc.ns.svc", "Localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Now: now, Lifetime: time.Hour})
	require.NoError(t, err)
	cas := []*x509.Certificate{ca.Cert}
	announce := func(name string, l *pki.Issued) *coordinationv1.Lease {
		holder, duration := "r0", int32(15)
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{LeaseLabel: "ca"},
				Annotations: map[string]string{TrustedCAsAnnotation: Fingerprint(ca.Cert),
					LeafAnnotation: string(leafCertPEM(l.Cert)), LeafSerialAnnotation: serial(l.Cert)}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &metav1.MicroTime{Time: now}},
		}
		require.NoError(t, signAnnouncement(lease, l.Key))
		return lease
	}
	reason := func(err error) string {
		t.Helper()
		var ae *AnnouncementError
		require.ErrorAs(t, err, &ae)
		return ae.Reason
	}

	got, err := VerifyAnnouncement(announce("ca-r0", leaf), cas, nil, nil)
	require.NoError(t, err)
	require.True(t, got.Equal(leaf.Cert), "the announced leaf")
	_, err = VerifyAnnouncement(announce("ca-r0", leaf), cas, []string{"localhost", "127.0.0.1", "svc.ns.svc"}, nil)
	require.NoError(t, err, "the Authority's hosts, in any order and case")

	moved := announce("ca-r0", leaf)
	moved.Name = "ca-r9"
	_, err = VerifyAnnouncement(moved, cas, nil, nil)
	require.Equal(t, certmetrics.AnnouncementForged, reason(err), "copied into another Lease")
	require.ErrorContains(t, err, "signature does not verify")

	edited := announce("ca-r0", leaf)
	edited.Annotations[TrustedCAsAnnotation] += ",0000"
	_, err = VerifyAnnouncement(edited, cas, nil, nil)
	require.Equal(t, certmetrics.AnnouncementForged, reason(err), "edited after signing")

	_, err = VerifyAnnouncement(announce("ca-r0", foreignLeaf(t, now)), cas, nil, nil)
	require.Equal(t, certmetrics.AnnouncementForged, reason(err), "a leaf of another CA")
	require.ErrorContains(t, err, "does not chain to a CA in the CA Secret")

	_, err = VerifyAnnouncement(announce("ca-r0", leaf), cas, []string{"other.ns.svc"}, nil)
	require.Equal(t, certmetrics.AnnouncementForged, reason(err), "a leaf of the CA for other names")
	require.ErrorContains(t, err, "neither this Authority's names")

	unsigned := announce("ca-r0", leaf)
	delete(unsigned.Annotations, SignatureAnnotation)
	_, err = VerifyAnnouncement(unsigned, cas, nil, nil)
	require.Equal(t, certmetrics.AnnouncementUnsigned, reason(err))

	garbled := announce("ca-r0", leaf)
	garbled.Annotations[SignatureAnnotation] = "not base64!"
	_, err = VerifyAnnouncement(garbled, cas, nil, nil)
	require.Equal(t, certmetrics.AnnouncementGarbled, reason(err))
}
